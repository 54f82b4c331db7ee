"""Where torch_llama.py's step spends its GPU time, by kernel family and by kernel.
Usage: python3 scripts/torch_profile_llama.py PATH/torch_llama.py [torch_llama.py's arguments]
Runs the anchor's definitions and warm-up (not its timing loop), then profiles three steps, so
that a zeropp `trainer bench --profile` of the same shape can be read kernel family by family."""
import sys, re, collections, torch
from torch.profiler import profile, ProfilerActivity

path, args = sys.argv[1], sys.argv[2:]
sys.argv = ["torch_llama.py"] + args
src = open(path).read()
cut = src.index("for _ in range(5): step()")
g = {"__name__": "anchor"}
exec(compile(src[:cut], "torch_llama.py", "exec"), g)
step = g["step"]
for _ in range(6): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
    for _ in range(3): step()
    torch.cuda.synchronize()
fam = collections.Counter(); names = collections.Counter()
rules = [("attention", r"sdpa|flash|fmha|attention|cudnn"), ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90"),
         ("norm", r"norm"), ("cross-entropy", r"log_softmax|nll_loss|softmax|cross"),
         ("optimizer", r"adam|multi_tensor|foreach"), ("embedding", r"embedding|index|scatter|gather"),
         ("reduce", r"reduce|sum"), ("triton-fused", r"triton"), ("copy/cast", r"copy|cast|to_|memcpy|memset|fill"),
         ("elementwise", r"elementwise|vectorized|unrolled|silu|add|mul")]
total = 0.0
for e in prof.key_averages():
    if e.device_type != torch.autograd.DeviceType.CUDA: continue  # kernels only, not CPU ops
    t = e.device_time_total / 1e3 / 3  # ms per step
    if t <= 0: continue
    total += t
    k = next((f for f, r in rules if re.search(r, e.key, re.I)), "other")
    fam[k] += t; names[(k, e.key[:100])] += t
print(f"== torch_llama.py {' '.join(args)}: GPU kernel time per step {total:.1f} ms")
for k, t in fam.most_common(): print(f"{k:<14} {t:8.2f} ms {100*t/total:5.1f}%")
print("-- top kernels")
for (k, n), t in names.most_common(30): print(f"{t:8.2f} ms  {k:<13} {n}")
print("-- matrix products by input shape (ms per step, calls per step, TFLOP/s)")
# Which inputs are the two matrices: addmm's are after its bias, mm's and _scaled_mm's first.
operands = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_scaled_mm": (0, 1)}
rows = []
for e in prof.key_averages(group_by_input_shape=True):
    if e.key not in operands: continue
    t = e.device_time_total / 1e3 / 3
    i, j = operands[e.key]
    a, b = e.input_shapes[i], e.input_shapes[j]
    fl = 2 * a[0] * a[1] * b[1] * e.count / 3 if len(a) == 2 and len(b) == 2 else 0
    rows.append((t, e.count / 3, fl / (t * 1e-3) / 1e12 if t > 0 else 0, e.key, e.input_shapes))
for t, n, tf, k, shp in sorted(rows, key=lambda r: -r[0])[:24]:
    print(f"{t:8.2f} ms {n:5.1f} calls {tf:6.0f} TFLOP/s  {k} {shp}")
