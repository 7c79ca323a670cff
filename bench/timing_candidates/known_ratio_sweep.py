"""A memory-bound Triton kernel that reads its whole input PASSES times (one launch): timing it
with PASSES = k against PASSES = 1 must give the byte ratio, which is known exactly.

Pass p of program i reads block (i + p * n_blocks / PASSES) mod n_blocks, so the blocks a program
re-reads were last touched about (n_blocks / PASSES) blocks earlier: for inputs well above the L2
size every pass comes from DRAM, and bytes moved are PASSES * input + a tiny partials vector.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _sweep_kernel(x_ptr, partial_ptr, n_blocks, keep_extra, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    first = tl.load(x_ptr + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK))
    extra = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(1, PASSES):
        block = (pid + p * (n_blocks // PASSES)) % n_blocks
        extra += tl.load(x_ptr + block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK))
    # keep_extra is 7 at run time (neither 1 nor a multiple of 16, so never specialised) and unknown
    # to the compiler: the extra passes are really read, and every PASSES gives the same output
    # (block sums), so the timer's output checks agree.
    result = tl.where(keep_extra == 12345, first + extra, first)
    tl.store(partial_ptr + pid, tl.sum(result, axis=0))


class MultiPassSweep(nn.Module):
    """Block sums of x (numel a multiple of BLOCK), reading x PASSES times."""

    def __init__(self, passes: int):
        super().__init__()
        self.passes = passes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() % BLOCK:
            raise ValueError(f"input numel {x.numel()} is not a multiple of {BLOCK}")
        n_blocks = x.numel() // BLOCK
        partial = torch.empty(n_blocks, device=x.device, dtype=torch.float32)
        _sweep_kernel[(n_blocks,)](x, partial, n_blocks, 7, PASSES=self.passes, BLOCK=BLOCK, num_warps=8)
        return partial


def bytes_moved(numel: int, passes: int) -> int:
    return 4 * (passes * numel + numel // BLOCK)
