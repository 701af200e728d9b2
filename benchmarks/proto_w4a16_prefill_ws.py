"""Prototype (issue 13, goals 3 and 5's TTFT): does Triton's Hopper warp specialization lift a prefill GEMM toward
cuBLAS, plain fp16 and with the 4-bit dequantization in its loop?

TTFT 1.2x of fp16 needs the 4-bit projections of a 512-token prompt within a few percent of an fp16 GEMM written in
Triton (RESULTS.md round29, 3). Triton 3.6 on sm_90 has a warp-specialization pass (`tl.range(...,
warp_specialize=True)`: producer warps issue the tensor-descriptor (TMA) loads, consumer warps compute), documented
for Blackwell and "simple matmul loops". This script measures, at the given rows, on the Llama-3-8B projections:

  * cuBLAS fp16 (`x @ W.T`) on the dequantized weight;
  * a Triton fp16 GEMM with both operands through tensor descriptors, three tile configs, without and with warp
    specialization (`f16_*_ws0|1`);
  * a fused 4-bit GEMM in a simple layout (int32 words [N, K/8], 8 K-nibbles a word, symmetric, group 128): the
    weight dequantized in registers as the wgmma A operand, x^T through a descriptor as B, six tile configs, without
    and with warp specialization (`w4_*_ws0|1`);
  * the shipped W4A16 route (`w4a16_matmul`) on a GPTQ weight of the same shape.

Each cell: us per call (graph replays over two weight copies: the two 4-bit copies of the smaller weights fit an
H200's L2, so their cells can be partly warm) and the error against the fp16 product. Compile failures are recorded
as ERR. Prints the best of each family per shape and writes JSON (argv[1]).
Usage: ROWS=512,2048 [SHAPES=4096x28672,...] python benchmarks/proto_w4a16_prefill_ws.py out.json
"""
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from optimum_amdx.benchmark.timing import graph_ms
from optimum_amdx.io import result_path_or_exit, write_json


@triton.jit
def w4_kernel(x_desc, w_desc, s_ptr, out_ptr, M, N, K, stride_om, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    offs_n = pid_n * BN + tl.arange(0, BN)
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
        xt = x_desc.load([pid_m * BM, k])
        ww = w_desc.load([pid_n * BN, k // 8])
        s = tl.load(s_ptr + (k // G) * N + offs_n)
        q = (ww[:, :, None] >> shifts[None, None, :]) & 0xF
        q = tl.reshape(q, [BN, BK])
        h = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0
        wd = h * s[:, None]
        acc = tl.dot(wd, tl.trans(xt), acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(tl.float16),
             mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


@triton.jit
def f16_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_om, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
        a = x_desc.load([pid_m * BM, k])
        b = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, tl.trans(b), acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(tl.float16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def run_w4(x: torch.Tensor, qw: torch.Tensor, s: torch.Tensor, out: torch.Tensor, cfg: tuple, G: int) -> None:
    """One launch of the fused 4-bit prototype; cfg = (BM, BN, BK, stages, warps, warp-specialized)."""
    BM, BN, BK, ST, W, WS = cfg
    M, K = x.shape
    N = qw.shape[0]
    xd = TensorDescriptor.from_tensor(x, [BM, BK])
    wd = TensorDescriptor.from_tensor(qw, [BN, BK // 8])
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    w4_kernel[grid](xd, wd, s, out, M, N, K, out.stride(0), BM=BM, BN=BN, BK=BK, G=G, STAGES=ST, WS=WS, num_warps=W)


def run_f16(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: tuple) -> None:
    """One launch of the Triton fp16 GEMM; cfg as `run_w4`'s."""
    BM, BN, BK, ST, W, WS = cfg
    M, K = x.shape
    N = w.shape[0]
    xd = TensorDescriptor.from_tensor(x, [BM, BK])
    wd = TensorDescriptor.from_tensor(w, [BN, BK])
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    f16_kernel[grid](xd, wd, out, M, N, K, out.stride(0), BM=BM, BN=BN, BK=BK, STAGES=ST, WS=WS, num_warps=W)


def dequant(qw: torch.Tensor, s: torch.Tensor, G: int) -> torch.Tensor:
    """The fp16 weight [N, K] of the prototype's layout (the reference and cuBLAS's operand)."""
    N, KW = qw.shape
    shifts = torch.arange(0, 32, 4, device=qw.device, dtype=torch.int32)
    q = ((qw[:, :, None] >> shifts) & 0xF).reshape(N, KW * 8).float()
    sc = s.float().t().repeat_interleave(G, dim=1)  # [N, K]
    return ((q - 8) * sc).half()


def main() -> None:
    if len(sys.argv) > 1:
        result_path_or_exit(sys.argv[1], "out")  # before measuring: it replaces only a result we wrote
    torch.manual_seed(0)
    G = 128
    shapes = [(int(a), int(b)) for a, b in (v.split("x") for v in os.environ.get("SHAPES", "4096x28672,14336x4096,4096x6144,4096x4096").split(","))]
    ms = [int(v) for v in os.environ.get("ROWS", "512").split(",")]
    w4_cfgs = [(bm, bn, bk, st, w, ws) for (bm, bn, bk, st, w) in
               [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 128, 3, 8), (64, 128, 64, 4, 4),
                (128, 256, 64, 3, 8)]
               for ws in (False, True)]
    f16_cfgs = [(bm, bn, bk, st, w, ws) for (bm, bn, bk, st, w) in
                [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 256, 64, 4, 8)] for ws in (False, True)]
    res = []
    for (K, N), M in itertools.product(shapes, ms):
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        qws = [torch.randint(-2**31, 2**31 - 1, (N, K // 8), device="cuda", dtype=torch.int32) for _ in range(2)]
        ss = [(torch.rand(K // G, N, device="cuda") * 0.02 + 0.001).half() for _ in range(2)]
        wds = [dequant(q, s, G) for q, s in zip(qws, ss)]  # [N, K]
        ref = x @ wds[0].t()
        out = torch.empty(M, N, device="cuda", dtype=torch.float16)
        row = {"K": K, "N": N, "M": M}
        row["cublas_us"] = graph_ms([lambda w=w: torch.matmul(x, w.t()) for w in wds]) * 1e3
        for cfg in f16_cfgs:
            name = "f16_%d_%d_%d_s%d_w%d_ws%d" % (cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], int(cfg[5]))
            try:
                run_f16(x, wds[0], out, cfg); torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                t = graph_ms([lambda w=w: run_f16(x, w, out, cfg) for w in wds]) * 1e3
                row[name] = (round(t, 1), err)
            except Exception as e:
                row[name] = "ERR " + str(e).splitlines()[0][:100] if str(e) else "ERR " + type(e).__name__
        for cfg in w4_cfgs:
            name = "w4_%d_%d_%d_s%d_w%d_ws%d" % (cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], int(cfg[5]))
            try:
                run_w4(x, qws[0], ss[0], out, cfg, G); torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                t = graph_ms([lambda q=q, s=s: run_w4(x, q, s, out, cfg, G) for q, s in zip(qws, ss)]) * 1e3
                row[name] = (round(t, 1), round(err, 5))
            except Exception as e:
                row[name] = "ERR " + (str(e).splitlines()[0][:100] if str(e) else type(e).__name__)
        # the shipped route on a comparable GPTQ weight
        try:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from bench_w4a16 import random_gptq
            w, _ = random_gptq(K, N, G, False, seed=1)
            from optimum_amdx.kernels.w4a16 import w4a16_matmul
            from bench_w4a16 import _clone
            wsl = [w, _clone(w)]
            row["shipped_us"] = graph_ms([lambda w=w: w4a16_matmul(x, w) for w in wsl]) * 1e3
        except Exception as e:
            row["shipped_us"] = "ERR " + str(e)[:100]
        print(json.dumps(row), flush=True)
        res.append(row)
        best = {}
        for k, v in row.items():
            if isinstance(v, tuple):
                fam = k.split("_")[0] + "_ws" + k[-1]
                if fam not in best or v[0] < best[fam][0]:
                    best[fam] = (v[0], k)
        print(f"== {K}x{N} M={M}: cuBLAS {row['cublas_us']:.1f} shipped {row['shipped_us'] if isinstance(row['shipped_us'], str) else round(row['shipped_us'], 1)} "
              + " ".join(f"{f}: {v[0]} ({row['cublas_us'] / v[0]:.2f} of cuBLAS, {v[1]})" for f, v in sorted(best.items())), flush=True)
    if len(sys.argv) > 1:
        write_json(sys.argv[1], {"device": torch.cuda.get_device_name(), "rows": res})


if __name__ == "__main__":
    main()
