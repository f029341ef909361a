"""The model zoo: layer profiles of the paper's models (gradient sizes, compute).

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .network import PARAM_BYTES


@dataclass(frozen=True)
class Layer:
    """One layer: its gradient size (parameters) and forward FLOPs per sample."""

    name: str
    params: int
    flops: float


@dataclass(frozen=True)
class ModelProfile:
    """A model's layers (input to output) and its compute time per iteration.

    ``compute`` is forward + backward seconds for one iteration on one worker;
    layer times are proportional to their FLOPs, backward twice forward.
    """

    name: str
    layers: tuple[Layer, ...]
    compute: float
    note: str = ""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return self.params * PARAM_BYTES


#: Effective GPU rate assumed for compute times (FLOP/s, fp32, a V100-class GPU
#: at realistic utilization). An assumption, not a paper number: change it with
#: :func:`with_compute`.
GPU_FLOPS = 10e12


def _compute(fwd_flops_per_sample: float, batch: int) -> float:
    return 3 * fwd_flops_per_sample * batch / GPU_FLOPS


def resnet50(batch: int = 64) -> ModelProfile:
    """ResNet-50 (torchvision v1.5 layout): 25.56 M parameters, batch 64 at 224²."""
    layers = [Layer("conv1", 7 * 7 * 3 * 64 + 2 * 64, 7 * 7 * 3 * 64 * 112 * 112)]
    cin = 64
    for stage, (planes, blocks, hw) in enumerate(
        ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7))
    ):
        for b in range(blocks):
            out = 4 * planes
            convs = [(cin, planes, 1), (planes, planes, 3), (planes, out, 1)]
            if b == 0:
                convs.append((cin, out, 1))  # projection shortcut
            p = sum(k * k * i * o + 2 * o for i, o, k in convs)
            fl = sum(k * k * i * o * hw * hw for i, o, k in convs)
            layers.append(Layer(f"layer{stage + 1}.{b}", p, fl))
            cin = out
    layers.append(Layer("fc", 2048 * 1000 + 1000, 2048 * 1000))
    fwd = sum(x.flops for x in layers)
    return ModelProfile("ResNet-50", tuple(layers), _compute(fwd, batch), f"batch {batch}")


def vgg19(batch: int = 64) -> ModelProfile:
    """VGG-19: 143.67 M parameters (16 convolutions, 3 fully connected), batch 64."""
    cfg = [(64, 224)] * 2 + [(128, 112)] * 2 + [(256, 56)] * 4 + [(512, 28)] * 4 + [(512, 14)] * 4
    layers = []
    cin = 3
    for i, (c, hw) in enumerate(cfg):
        layers.append(Layer(f"conv{i + 1}", 9 * cin * c + c, 9 * cin * c * hw * hw))
        cin = c
    for i, (a, b) in enumerate(((25088, 4096), (4096, 4096), (4096, 1000))):
        layers.append(Layer(f"fc{i + 1}", a * b + b, a * b))
    fwd = sum(x.flops for x in layers)
    return ModelProfile("VGG-19", tuple(layers), _compute(fwd, batch), f"batch {batch}")


def bert_base(batch: int = 32, seq: int = 128) -> ModelProfile:
    """BERT-base: 109.5 M parameters (30522-word vocabulary, 12 layers of 768),
    batch 32 of 128 tokens. Embeddings cost no FLOPs but their gradient is dense."""
    d, ff, v = 768, 3072, 30522
    layers = [Layer("embeddings", v * d + 512 * d + 2 * d + 2 * d, 0.0)]
    for i in range(12):
        attn = 4 * (d * d + d) + 2 * d
        layers.append(Layer(f"layer{i}.attention", attn, seq * (4 * d * d + 2 * seq * d)))
        ffn = d * ff + ff + ff * d + d + 2 * d
        layers.append(Layer(f"layer{i}.ffn", ffn, seq * 2 * d * ff))
    layers.append(Layer("pooler", d * d + d, d * d))
    fwd = sum(x.flops for x in layers)
    return ModelProfile(
        "BERT-base", tuple(layers), _compute(fwd, batch), f"batch {batch}×{seq} tokens"
    )


def lstm_lm(
    batch: int = 64, steps: int = 35, vocab: int = 200_000, hidden: int = 1024
) -> ModelProfile:
    """A large-vocabulary LSTM language model (our stand-in for the paper's LSTM):
    a 200k × 1024 embedding, two LSTM layers of 1024 and a full 1024 × 200k softmax,
    426.6 M parameters; batch 64 × 35 steps."""
    lstm = 4 * (hidden + hidden) * hidden + 8 * hidden
    tokens = steps
    layers = [
        Layer("embedding", vocab * hidden, 0.0),
        Layer("lstm1", lstm, tokens * 4 * 2 * hidden * hidden),
        Layer("lstm2", lstm, tokens * 4 * 2 * hidden * hidden),
        Layer("softmax", hidden * vocab + vocab, tokens * hidden * vocab),
    ]
    fwd = sum(x.flops for x in layers)
    return ModelProfile(
        "LSTM-LM", tuple(layers), _compute(fwd, batch), f"batch {batch}×{steps} steps"
    )


def paper_models() -> list[ModelProfile]:
    """The models of the reproduction, smallest first."""
    return [resnet50(), bert_base(), vgg19(), lstm_lm()]


#: The models by the names ``switchml simulate --params`` accepts.
MODELS: dict[str, Callable[[], ModelProfile]] = {
    "resnet50": resnet50,
    "bert": bert_base,
    "vgg19": vgg19,
    "lstm": lstm_lm,
}


def with_compute(model: ModelProfile, compute: float) -> ModelProfile:
    """The same model with another compute time per iteration."""
    return replace(model, compute=compute)
