"""float32 memory a pass's captures are written into, a slice a capture, handed to the C call as
an address; the capture's tensor (a view of its slice) is made when the capture is first read.
Right after a pass, each torch op costs ~5-10 us (its code and data cold, 2026-12-07): a
`full` trace's step allocated its probabilities and residual rows with one each."""
from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 16  # floats: every slice starts on a 64-byte line


@dataclass
class Slice:
    buf: torch.Tensor
    start: int
    size: int
    address: int

    def tensor(self, *shape: int) -> torch.Tensor:
        return self.buf[self.start:self.start + self.size].view(*shape)


@dataclass
class Arena:
    chunk: int = 1 << 18  # floats a new buffer has at least (1 MB); a buffer lives while a slice of it does
    buf: torch.Tensor | None = None
    base: int = 0  # buf's address
    used: int = 0

    def take(self, size: int) -> Slice:
        start = -(-self.used // ALIGN) * ALIGN
        if self.buf is None or start + size > self.buf.shape[0]:
            self.buf = torch.empty(max(self.chunk, size))
            self.base, start = self.buf.data_ptr(), 0
        self.used = start + size
        return Slice(self.buf, start, size, self.base + 4 * start)
