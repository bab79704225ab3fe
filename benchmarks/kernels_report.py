"""Turn kernels_bench.json (from benchmarks/kernels_bench.py) into the markdown tables of docs/kernels.md.

python benchmarks/kernels_report.py OUT/kernels_bench.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    d = json.load(open(path))
    env, sec = d["env"], d["sections"]
    c = sec.get("ceilings", {})
    print(
        f"Machine: {env['device']} ({env['sms']} SMs), driver/clocks {env['driver']}, torch {env['torch']}, "
        f"triton {env['triton']}, liger-kernel {env['liger_kernel']}. Ceilings measured in the same run: "
        f"device-to-device copy {c.get('copy_TBps', 0):.2f} TB/s (read + write), bf16 GEMM 8192^3 "
        f"{c.get('gemm_bf16_8192_TFLOPs', 0):.0f} TFLOP/s.\n"
    )
    print("fp8 (bytes = input read + output written, once each; time = median per call of back-to-back calls):\n")
    print("| op | T x H | implementation | time ms | TB/s | % of copy | peak extra GB |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in sec.get("fp8_speed", []):
        if "ms" in r:
            print(
                f"| {r['op']} | {r['T']}x{r['H']} | {r['impl']} | {r['ms']:.3f} | {r['TBps']:.2f} | "
                f"{100 * r['TBps'] / c.get('copy_TBps', 1):.0f}% | {r['peak_extra_GB']:.2f} |"
            )
    print("\nEAGLE-3 loss, forward + backward (median of 15, CUDA events), bf16 inputs, target_probs bf16:\n")
    print("| T x H x V | implementation | time ms | GEMMs done | achieved TFLOP/s | vs 3-GEMM cuBLAS floor | peak extra GB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    floor = sec.get("loss_breakdown", {})
    for r in sec.get("loss_speed", []):
        if "ms" in r:
            n = r["gemm_flops"] // (2 * r["T"] * r["H"] * r["V"])
            rel = ""
            if floor and (r["T"], r["H"], r["V"]) == (floor["T"], floor["H"], floor["V"]):
                rel = f"{r['ms'] / floor['three_gemms_full_ms']:.2f}x"
            print(
                f"| {r['T']}x{r['H']}x{r['V']} | {r['impl']} | {r['ms']:.2f} | {n} | {r['achieved_TFLOPs']:.0f} | {rel} | "
                f"{r['peak_extra_GB']:.2f} |"
            )
    if floor:
        print(
            "\nBreakdown at "
            + f"{floor['T']}x{floor['H']}x{floor['V']}, chunk {floor['chunk']} (each piece alone, summed over chunks):\n"
        )
        for k, v in floor.items():
            if k.endswith("_ms") or k.endswith("_x_chunks"):
                print(f"- {k}: {v:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
