#!/usr/bin/env bash
# One trainer process per rank under OpenMPI's mpirun.
#   scripts/mpirun.sh NP CONFIG [--set ...]
# CPU (a trainer built with --features mpi):
#   scripts/mpirun.sh 4 configs/tiny.toml --set 'dist.backend="mpi"' --set dist.gpus_per_node=2
# GPUs (built with --features cuda; NCCL between ranks, rank 0's host is the rendezvous):
#   HOSTS=node1:8,node2:8 scripts/mpirun.sh 16 configs/paper/gpt18b-2k.toml --set 'dist.backend="nccl"' \
#     --set dist.world_size=16 --set dist.gpus_per_node=8 --set zero.hpz_partition_size=8
# Rank, world and local rank come from OMPI_COMM_WORLD_*; dist.world_size must equal NP.
set -euo pipefail
NP=${1:?usage: scripts/mpirun.sh NP CONFIG [--set ...]}
CONFIG=${2:?usage: scripts/mpirun.sh NP CONFIG [--set ...]}
shift 2
TRAINER=${TRAINER:-target/release/trainer}
HOSTS=${HOSTS:-localhost:$NP}
export MASTER_ADDR=${MASTER_ADDR:-$(echo "${HOSTS%%,*}" | cut -d: -f1)}
export MASTER_PORT=${MASTER_PORT:-29500}
root=()
[[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
# -x passes the rendezvous (and NCCL / library settings, where set) to every rank.
pass=()
for v in MASTER_ADDR MASTER_PORT NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA LD_LIBRARY_PATH; do
  [[ -n ${!v:-} ]] && pass+=(-x "$v")
done
# --oversubscribe: more ranks than cores is fine for CPU tests.
exec mpirun "${root[@]}" --oversubscribe -np "$NP" --host "$HOSTS" "${pass[@]}" \
  "$TRAINER" --config "$CONFIG" --set "dist.world_size=$NP" "$@"
