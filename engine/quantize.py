"""Turn a loaded model's linear layers into weight-only int8 / int4 ones (engine/layers/quantized.py).

Every `Linear` (attention, MLP, LM head, router) whose shape the CPU kernels take is
quantized; MoE experts (stacked parameters, not Linears) and the embedding table stay
float. With int4 and a GGUF file, a layer whose every part (q/k/v, gate/up) is stored as
Q4_0 / Q4_1 blocks takes the file's codes as they are; the others are quantized from the
dequantized float weight (a Q8_0 or K-quant tensor is thus dequantized, then requantized).
Under int4 an LM head quantized at load is made int8, as llama.cpp's Q4 files keep their
output matrix at 6-8 bits: on SmolLM2 an int4 head alone moved the teacher-forced top token
off float32's at 19% of positions (KL 0.058 nats), an int8 head at 3.6% (KL 0.0016).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.layers.linear import Linear
from engine.layers.quantized import can_quantize, int4_from_codes, quantize_int4, quantize_int8
from engine.model import checkpoint_target

Codes = dict[str, tuple]  # HF name -> (codes, scale, zero, GGUF type), from engine.gguf_loader.read_tensors


@dataclass
class QuantizationReport:
    kind: str
    from_file: dict[str, int] = field(default_factory=dict)  # GGUF type -> layers using its codes as they are
    at_load: int = 0  # layers quantized from their float weight
    head_int8: bool = False  # int4 with the LM head quantized at load: int8 instead
    kept_float: list[str] = field(default_factory=list)  # Linears the kernels cannot take
    bytes: int = 0  # codes + scales

    def summary(self) -> str:
        parts = [f"{n} from GGUF {t} blocks" for t, n in sorted(self.from_file.items())]
        if self.at_load:
            parts.append(f"{self.at_load} quantized at load" + (", the LM head to int8" if self.head_int8 else ""))
        if self.kept_float:
            parts.append(f"{len(self.kept_float)} kept float")
        return f"{self.kind} weights ({', '.join(parts)}; {self.bytes / 2**20:.1f} MiB)"


def quantize_model(model: nn.Module, kind: str, codes: Codes | None = None) -> QuantizationReport:
    report = QuantizationReport(kind)
    by_param: dict[str, dict[int | None, tuple]] = defaultdict(dict)
    for key, value in (codes or {}).items():
        name, expert, shard = checkpoint_target(key)
        if expert is None:
            by_param[name][shard] = value
    uses = defaultdict(int)  # a weight shared by two modules (a tied LM head) keeps its float copy
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] += 1
    for name, m in model.named_modules():
        if not isinstance(m, Linear) or m.weight is None:
            continue
        w = m.weight
        if not can_quantize(kind, tuple(w.shape), w.device):
            report.kept_float.append(name)
            continue
        qw = None
        if kind == "int4":
            qw = _from_file(by_param.get(f"{name}.weight", {}), tuple(w.shape))
        if qw is not None:
            t = qw.source.removeprefix("GGUF ")
            report.from_file[t] = report.from_file.get(t, 0) + 1
        else:
            head = kind == "int4" and m is getattr(model, "lm_head", None)
            qw = quantize_int8(w) if kind == "int8" or head else quantize_int4(w)
            report.at_load += 1
            report.head_int8 |= head
        m.quantize(qw, drop_float=uses[id(w)] == 1)
        report.bytes += qw.nbytes
    return report


def _from_file(parts: dict[int | None, tuple], shape: tuple[int, int]):
    """A layer's int4 weight from its GGUF codes, if every part of it has them (one type)."""
    if not parts:
        return None
    order = [None] if None in parts else sorted(parts)
    if order != [None] and order != list(range(len(order))):
        return None
    chosen = [parts[s] for s in order]
    if len({c[3] for c in chosen}) != 1:
        return None
    codes, scale, zero = (torch.cat([c[i] for c in chosen]) for i in range(3))
    if tuple(codes.shape) != shape:  # some parts missing (or stored elsewhere): quantize the float weight
        return None
    return int4_from_codes(codes, scale, zero, f"GGUF {chosen[0][3]}")
