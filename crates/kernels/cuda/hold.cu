// hold.cu: keeps a stream busy for a given time (comm's emulated slow link between nodes).
// One thread, bound by nothing but the clock: it sleeps until `ns` nanoseconds of the global
// timer have passed since it started.
#include "common.cuh"

extern "C" __global__ void hold_stream(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
