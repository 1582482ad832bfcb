"""Turn a loaded model's linear layers into weight-only int8 / int4 ones (QuantizedWeight).

Every `Linear` (attention, MLP, LM head, router) whose shape the kernels take is quantized;
MoE experts (stacked parameters, not Linears) and the embedding table stay float. With a
GGUF file, a layer whose every part (q/k/v, gate/up) is stored in blocks of the kind's own
format takes the file's codes as they are: Q8_0 for int8, Q4_0 / Q4_1 for int4. The others
are quantized from the dequantized float weight (a K-quant tensor is thus dequantized, then
requantized).

An LM head quantized at load is int8 under int4 too, as llama.cpp's Q4 files keep their
output matrix at 6-8 bits: on SmolLM2 an int4 head alone moved the teacher-forced top token
off float32's at 19% of positions (KL 0.058 nats), a per-row int8 one at 3.6% (KL 0.0016).
For the same reason a head stored as Q8_0 (or the embedding a tied head shares: SmolLM2's)
takes those codes under int4 as under int8, and is then exactly the float32 engine's head;
one stored as Q4_0 / Q4_1 keeps its blocks under int4.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.layers.linear import Linear
from engine.layers.quantized import (QuantizedWeight, c_kernels, can_quantize, file_types, int4_from_codes,
                                     int8_from_codes, quantize_int4, quantize_int8)
from engine.model import checkpoint_target

Codes = dict[str, tuple]  # HF name -> (codes, d, m, GGUF type), from engine.checkpoint.gguf.read_tensors


@dataclass
class QuantizationReport:
    kind: str
    from_file: dict[str, int] = field(default_factory=dict)  # GGUF type -> layers using its codes as they are
    at_load: int = 0  # layers quantized from their float weight
    head_int8: bool = False  # int4 with the LM head quantized at load: int8 instead
    kept_float: list[str] = field(default_factory=list)  # Linears the kernels cannot take
    bytes: int = 0  # codes + scales
    c_kernels: bool = True  # run by engine/kernels/cpu_quant.c (float32 activations), else PyTorch's

    def summary(self) -> str:
        parts = [f"{n} from GGUF {t} blocks" + (" (the LM head, int8)" if self.kind == "int4" and t == "Q8_0" else "")
                 for t, n in sorted(self.from_file.items())]
        if self.at_load:
            parts.append(f"{self.at_load} quantized at load" + (", the LM head to int8" if self.head_int8 else ""))
        if self.kept_float:
            parts.append(f"{len(self.kept_float)} kept float")
        kernels = "C kernels, float32 activations" if self.c_kernels else "PyTorch kernels, bfloat16 activations"
        return f"{self.kind} weights ({', '.join(parts)}; {self.bytes / 2**20:.1f} MiB; {kernels})"


def quantize_model(model: nn.Module, kind: str, codes: Codes | None = None) -> QuantizationReport:
    report = QuantizationReport(kind, c_kernels=c_kernels())
    by_param: dict[str, dict[int | None, tuple]] = defaultdict(dict)
    for key, value in (codes or {}).items():
        name, expert, shard = checkpoint_target(key, fused_qkv=model.config.mla is None)
        if expert is None:
            by_param[name][shard] = value
    names = defaultdict(list)  # a weight shared by two modules (a tied LM head) keeps its float copy
    for pname, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(pname)
    head_module = getattr(model, "lm_head", None)
    for name, m in model.named_modules():
        if not isinstance(m, Linear) or m.weight is None:
            continue
        w = m.weight
        if not can_quantize(kind, tuple(w.shape), w.device):
            report.kept_float.append(name)
            continue
        head = m is head_module
        # the head reads int8 codes under int4 too; a tied head finds them under the embedding's name
        kinds = ("int8", kind) if head else (kind,)
        qw = next((q for k in kinds for pname in names[id(w)]
                   if (q := _from_file(by_param.get(pname, {}), tuple(w.shape), k)) is not None), None)
        if qw is not None:
            t = qw.source.removeprefix("GGUF ")
            report.from_file[t] = report.from_file.get(t, 0) + 1
        else:
            qw = quantize_int8(w) if kind == "int8" or head else quantize_int4(w)
            report.at_load += 1
            report.head_int8 |= head and kind == "int4"
        m.quantize(qw, drop_float=len(names[id(w)]) == 1)
        report.bytes += qw.nbytes
    return report


def _from_file(parts: dict[int | None, tuple], shape: tuple[int, int], kind: str) -> QuantizedWeight | None:
    """A layer's `kind` weight from its GGUF codes, if every part of it has them, all in one
    of the block types `kind` takes as they are."""
    if not parts:
        return None
    order = [None] if None in parts else sorted(parts)
    if order != [None] and order != list(range(len(order))):
        return None
    chosen = [parts[s] for s in order]
    types = {c[3] for c in chosen}
    if len(types) != 1 or not types <= set(file_types(kind)):
        return None
    q, d, m = (None if chosen[0][i] is None else torch.cat([c[i] for c in chosen]) for i in range(3))
    if tuple(q.shape) != shape:  # some parts missing (or stored elsewhere): quantize the float weight
        return None
    source = f"GGUF {chosen[0][3]}"
    return int8_from_codes(q, d, source) if kind == "int8" else int4_from_codes(q, d, m, source)
