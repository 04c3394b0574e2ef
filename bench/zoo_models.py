"""The model zoo of ``bench/zoo.py``: six image / text models built from configs with seeded random weights.

Every builder returns a :class:`ZooModel`: an eval-mode ``torch.nn.Module`` whose ``forward`` takes plain
tensors and returns one tensor, the example inputs (batch 1) and their names. Nothing is downloaded: the
Hugging Face architectures (ResNet-50, ConvNeXt-T, ViT-B/16, BERT-base, EfficientNet-B0, GPT-2 and a
Llama-family decoder with SmolLM-135M's sizes) are instantiated
from their configs, and MobileNetV3-Large (which ``transformers`` lacks) is defined here.

``small=True`` gives scaled-down versions (one block per stage, narrow channels, 64x64 images, two
transformer layers of width 64, sequence 32): the same architectures and op kinds in a fraction of the
compile and run time, for smoke runs and tests.

>>> from zoo_models import build
>>> zm = build("resnet50", small=True)
>>> y = zm.module(*zm.inputs)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

def _stub_torchvision_operators() -> None:
    """Let torchvision import without its C++ operators: the wheel that matches this torch registers
    fake/autograd kernels for ``torchvision::nms`` in two modules at import, which raises when its own
    operator library is not loadable ("operator torchvision::nms does not exist") — and transformers
    imports torchvision whenever it is installed, so the Hugging Face models fail too. The models here
    never call those operators; empty modules in their place are enough."""
    import sys
    import types

    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))


_stub_torchvision_operators()

MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_b_16", "bert_base",
          "gpt2", "smollm_135m", "wav2vec2_base", "whisper_tiny_encoder", "swin_t",
          "deeplabv3_mobilenet_v3", "densenet121", "segformer_b0",
          "tv_swin_t", "tv_swin_v2_t", "tv_maxvit_t", "r3d_18", "fcn_resnet50", "deberta_v3_base", "phi3_decoder",
          "convnextv2_tiny")
#: the torchvision architectures (the rest are Hugging Face models or defined here)
TORCHVISION_MODELS = ("deeplabv3_mobilenet_v3", "densenet121", "tv_swin_t", "tv_swin_v2_t", "tv_maxvit_t", "r3d_18",
                      "fcn_resnet50")
#: issue 39's families (video, relative-position and window attention, rolled windows, empty slices,
#: GRN, SegFormer, FCN): ``--models issue39`` runs these
ISSUE39_MODELS = ("tv_swin_t", "tv_swin_v2_t", "tv_maxvit_t", "r3d_18", "deberta_v3_base", "phi3_decoder",
                  "segformer_b0", "convnextv2_tiny", "fcn_resnet50")
SEED = 0


@dataclass
class ZooModel:
    """A model ready to export: ``module(*inputs)`` returns one tensor."""

    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    description: str


class _FirstOutput(nn.Module):
    """Calls a Hugging Face model with ``return_dict=False`` and returns the first output (logits or
    last hidden state), so that exporters and frontends see a single tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args, return_dict=False)[0]


def _image(size: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(1, 3, size, size, generator=gen),)


def _randomise_norms(module: nn.Module) -> None:
    """Give batch/layer norms non-trivial statistics and affine parameters (fresh ones are identities,
    which would hide errors in how a backend folds them)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen))
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)) and m.weight is not None:
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))


def _hf(name: str, model: nn.Module, inputs, input_names, description: str) -> ZooModel:
    model.eval()
    _randomise_norms(model)
    return ZooModel(name, _FirstOutput(model).eval(), inputs, input_names, description)


def resnet50(small: bool = False) -> ZooModel:
    """ResNet-50 (``transformers`` ResNetForImageClassification, 1000 classes, 224x224)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    if small:
        cfg = ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                           layer_type="bottleneck", num_labels=10)
    else:
        cfg = ResNetConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                           layer_type="bottleneck", num_labels=1000)
    torch.manual_seed(SEED)
    return _hf("resnet50", ResNetForImageClassification(cfg), _image(64 if small else 224), ("pixel_values",),
               "HF ResNetForImageClassification, logits")


def convnext_tiny(small: bool = False) -> ZooModel:
    """ConvNeXt-T (``transformers`` ConvNextForImageClassification, 1000 classes, 224x224)."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    if small:
        cfg = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10)
    else:
        cfg = ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], num_labels=1000)
    torch.manual_seed(SEED)
    return _hf("convnext_tiny", ConvNextForImageClassification(cfg), _image(64 if small else 224),
               ("pixel_values",), "HF ConvNextForImageClassification, logits")


def vit_b_16(small: bool = False) -> ZooModel:
    """ViT-B/16 (``transformers`` ViTForImageClassification, eager attention, 1000 classes, 224x224)."""
    from transformers import ViTConfig, ViTForImageClassification

    if small:
        cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        image_size=64, patch_size=16, num_labels=10)
    else:
        cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=224, patch_size=16, num_labels=1000)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    return _hf("vit_b_16", ViTForImageClassification(cfg), _image(cfg.image_size), ("pixel_values",),
               "HF ViTForImageClassification (eager attention), logits")


def bert_base(small: bool = False) -> ZooModel:
    """BERT-base (``transformers`` BertModel, eager attention), sequence 128: int64 ``input_ids`` and
    ``attention_mask`` (the last eighth of the positions padded) in, ``last_hidden_state`` out."""
    from transformers import BertConfig, BertModel

    if small:
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=128)
        seq = 32
    else:
        cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, max_position_embeddings=512)
        seq = 128
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = BertModel(cfg, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=gen, dtype=torch.int64)
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[:, seq - seq // 8:] = 0
    return _hf("bert_base", model, (ids, mask), ("input_ids", "attention_mask"),
               f"HF BertModel (eager attention), last_hidden_state, seq {seq}")


def _token_ids(vocab: int, seq: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, vocab, (1, seq), generator=gen, dtype=torch.int64)


class _NoCache(nn.Module):
    """Calls a Hugging Face decoder with ``use_cache=False, return_dict=False`` on ``input_ids``
    alone and returns the last hidden state: one forward pass over the whole sequence (a prefill
    without a KV cache), the way an exporter sees it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False, return_dict=False)[0]


def _decoder(name: str, model: nn.Module, vocab: int, seq: int, description: str) -> ZooModel:
    model.eval()
    _randomise_norms(model)
    _randomise_rms_norms(model)
    return ZooModel(name, _NoCache(model).eval(), (_token_ids(vocab, seq),), ("input_ids",), description)


def _randomise_rms_norms(module: nn.Module) -> None:
    """RMSNorm weights (ones when fresh) made non-trivial, as :func:`_randomise_norms` does for
    layer norms."""
    gen = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        for m in module.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=gen))


def gpt2(small: bool = False, seq: int | None = None) -> ZooModel:
    """GPT-2 small (``transformers`` GPT2Model, default (sdpa) attention), sequence 128:
    ``input_ids`` in, ``last_hidden_state`` out."""
    from transformers import GPT2Config, GPT2Model

    if small:
        cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4)
    else:
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    seq = seq or (32 if small else 128)
    torch.manual_seed(SEED)
    return _decoder("gpt2", GPT2Model(cfg), cfg.vocab_size, seq,
                    f"HF GPT2Model (sdpa attention), last_hidden_state, seq {seq}")


def smollm_135m(small: bool = False, seq: int | None = None) -> ZooModel:
    """A Llama-family decoder with SmolLM-135M's sizes (``transformers`` LlamaModel: 30 layers of
    width 576, grouped-query attention with 9 query / 3 key-value heads, RMSNorm, RoPE, SiLU MLP of
    1536; default (sdpa) attention), sequence 128: ``input_ids`` in, ``last_hidden_state`` out.
    Small: 2 layers of width 96, 3 / 1 heads of 32, MLP 128."""
    from transformers import LlamaConfig, LlamaModel

    if small:
        cfg = LlamaConfig(vocab_size=1000, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                          max_position_embeddings=2048, rms_norm_eps=1e-5)
    else:
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
    seq = seq or (32 if small else 128)
    torch.manual_seed(SEED)
    return _decoder("smollm_135m", LlamaModel(cfg), cfg.vocab_size, seq,
                    f"HF LlamaModel with SmolLM-135M sizes (GQA 9/3, sdpa attention), last_hidden_state, seq {seq}")


def efficientnet_b0(small: bool = False) -> ZooModel:
    """EfficientNet-B0 (``transformers`` EfficientNetForImageClassification with B0's coefficients,
    1000 classes, 224x224)."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    if small:
        cfg = EfficientNetConfig(width_coefficient=0.25, depth_coefficient=0.25, image_size=64, hidden_dim=320,
                                 dropout_rate=0.2, num_labels=10)
    else:
        cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                                 dropout_rate=0.2, num_labels=1000)
    torch.manual_seed(SEED)
    model = EfficientNetForImageClassification(cfg)
    # HF writes the global average pool as AvgPool2d(hidden_dim, ceil_mode=True): a window larger than
    # the 7x7 input that only ceil_mode clips. The same values, but OpenVINO cannot convert it and TVM
    # runs it as a 1280x1280 window; the equivalent adaptive pool is what the architecture means.
    model.efficientnet.pooler = nn.AdaptiveAvgPool2d(1)
    return _hf("efficientnet_b0", model, _image(cfg.image_size), ("pixel_values",),
               "HF EfficientNetForImageClassification (B0 coefficients; pooler as AdaptiveAvgPool2d(1)), logits")


# ----------------------------------------------------------------------------------------------
# MobileNetV3-Large, written from the paper's table (Howard et al. 2019, table 1)
# ----------------------------------------------------------------------------------------------
# (kernel, expansion channels, output channels, squeeze-excite, activation, stride)
MOBILENET_V3_LARGE = (
    (3, 16, 16, False, "relu", 1),
    (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1),
    (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hardswish", 2),
    (3, 200, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 480, 112, True, "hardswish", 1),
    (3, 672, 112, True, "hardswish", 1),
    (5, 672, 160, True, "hardswish", 2),
    (5, 960, 160, True, "hardswish", 1),
    (5, 960, 160, True, "hardswish", 1),
)


def _divisible(channels: float, divisor: int = 8) -> int:
    """Round to a multiple of ``divisor`` without going below 90% of the value (MobileNet's rule)."""
    rounded = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * channels else rounded


def _act(kind: str) -> nn.Module:
    return nn.Hardswish() if kind == "hardswish" else nn.ReLU()


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: str | None = None) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout, eps=1e-3)]
    if act:
        layers.append(_act(act))
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Global average pool, 1x1 conv down to a quarter, ReLU, 1x1 conv back, hard sigmoid, scale."""

    def __init__(self, channels: int):
        super().__init__()
        squeezed = _divisible(channels / 4)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        s = torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * s


class InvertedResidual(nn.Module):
    """1x1 expansion (skipped when it would not widen), depthwise kxk, optional squeeze-excite, 1x1
    projection; a residual add when the shape is kept."""

    def __init__(self, cin: int, kernel: int, expand: int, cout: int, se: bool, act: str, stride: int):
        super().__init__()
        layers: list[nn.Module] = []
        if expand != cin:
            layers.append(_conv_bn(cin, expand, 1, act=act))
        layers.append(_conv_bn(expand, expand, kernel, stride, groups=expand, act=act))
        if se:
            layers.append(SqueezeExcite(expand))
        layers.append(_conv_bn(expand, cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    """MobileNetV3 from a block table: 3x3/2 stem, the inverted residual blocks, 1x1 conv to 6x the last
    block's width, global pool, two linear layers (hard-swish between; dropout is a no-op in eval)."""

    def __init__(self, table, width: float = 1.0, last_channels: int = 1280, num_classes: int = 1000):
        super().__init__()
        stem = _divisible(16 * width)
        layers: list[nn.Module] = [_conv_bn(3, stem, 3, 2, act="hardswish")]
        cin = stem
        for kernel, expand, cout, se, act, stride in table:
            expand, cout = _divisible(expand * width), _divisible(cout * width)
            layers.append(InvertedResidual(cin, kernel, expand, cout, se, act, stride))
            cin = cout
        head = 6 * cin
        layers.append(_conv_bn(cin, head, 1, act="hardswish"))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(head, last_channels), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(last_channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v3_large(small: bool = False) -> ZooModel:
    """MobileNetV3-Large (defined here; 1000 classes, 224x224). Small: a quarter of the width and one
    block of each kind (plain, squeeze-excite with ReLU, hard-swish, squeeze-excite with hard-swish)."""
    torch.manual_seed(SEED)
    if small:
        table = tuple(MOBILENET_V3_LARGE[i] for i in (0, 1, 3, 6, 12))
        model = MobileNetV3(table, width=0.25, last_channels=128, num_classes=10)
    else:
        model = MobileNetV3(MOBILENET_V3_LARGE)
    model.eval()
    _randomise_norms(model)
    return ZooModel("mobilenet_v3_large", model, _image(64 if small else 224), ("x",),
                    "MobileNetV3-Large defined in bench/zoo_models.py, logits")


# ----------------------------------------------------------------------------------------------
# Speech encoders, Swin, and the torchvision segmentation / DenseNet models
# ----------------------------------------------------------------------------------------------


def _audio(samples: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(1, samples, generator=gen),)


def wav2vec2_base(small: bool = False) -> ZooModel:
    """wav2vec 2.0 base (``transformers`` Wav2Vec2Model, eager attention): one second of 16 kHz audio in,
    ``last_hidden_state`` out. Its positional convolution carries a weight norm (``weight_g``/``weight_v``)."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    if small:
        cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        samples = 1600
    else:
        cfg = Wav2Vec2Config()  # the base model's sizes: 12 layers of 768, 7 feature convolutions
        samples = 16000
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    return _hf("wav2vec2_base", Wav2Vec2Model(cfg), _audio(samples), ("input_values",),
               f"HF Wav2Vec2Model (eager attention), last_hidden_state, {samples} samples")


def whisper_tiny_encoder(small: bool = False) -> ZooModel:
    """Whisper-tiny's encoder (``transformers`` WhisperEncoder, eager attention): a 30 s log-mel
    spectrogram (80 x 3000) in, the encoder states out. Two conv1d + GELU, then 4 transformer layers."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if small:
        cfg = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                            num_mel_bins=16, max_source_positions=50)
    else:
        cfg = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                            num_mel_bins=80, max_source_positions=1500)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    mel = torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=gen)
    return _hf("whisper_tiny_encoder", WhisperEncoder(cfg), (mel,), ("input_features",),
               f"HF WhisperEncoder (eager attention), last_hidden_state, {tuple(mel.shape)} mel")


def swin_t(small: bool = False) -> ZooModel:
    """Swin-T (``transformers`` SwinForImageClassification, 1000 classes, 224x224): shifted windows,
    patch merging."""
    from transformers import SwinConfig, SwinForImageClassification

    if small:
        cfg = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2, 2], num_heads=[2, 2, 4],
                         window_size=4, num_labels=10)
    else:
        cfg = SwinConfig(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                         window_size=7, num_labels=1000)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    return _hf("swin_t", SwinForImageClassification(cfg), _image(cfg.image_size), ("pixel_values",),
               "HF SwinForImageClassification (eager attention), logits")


def segformer_b0(small: bool = False) -> ZooModel:
    """SegFormer-B0 (``transformers`` SegformerForSemanticSegmentation with nvidia/mit-b0's sizes, 150
    labels, 512x512): efficient attention over keys and values of a spatial-reduction conv, Mix-FFN's
    depthwise 3x3 between token and image layouts, and a decode head that upsamples four stages
    bilinearly to 1/4 of the input and concatenates them; logits at 128x128.
    Small: one block per stage, hidden sizes [16, 32, 40, 64] (the same heads and reductions), 64x64."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    if small:
        cfg = SegformerConfig(hidden_sizes=[16, 32, 40, 64], depths=[1, 1, 1, 1], decoder_hidden_size=32,
                              num_labels=10)
    else:
        cfg = SegformerConfig(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], decoder_hidden_size=256,
                              num_labels=150)
    # mit-b0's: sr_ratios [8, 4, 2, 1], heads [1, 2, 5, 8], patch sizes [7, 3, 3, 3], strides [4, 2, 2, 2]
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    size = 64 if small else 512
    return _hf("segformer_b0", SegformerForSemanticSegmentation(cfg), _image(size), ("pixel_values",),
               f"HF SegformerForSemanticSegmentation (mit-b0 sizes), logits at 1/4 of {size}x{size}")


def _torchvision():
    """torchvision, imported after :func:`_stub_torchvision_operators`."""
    import torchvision

    return torchvision


class _SegmentationOut(nn.Module):
    """torchvision's segmentation models return ``{"out": ...}``; exporters want the tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def deeplabv3_mobilenet_v3(small: bool = False) -> ZooModel:
    """DeepLabV3 with a dilated MobileNetV3-Large backbone (torchvision, 21 classes, no auxiliary head),
    520x520: ASPP (dilated 3x3 convs, image pooling upsampled bilinearly), logits upsampled to the input."""
    tv = _torchvision()
    from torchvision.models.segmentation.deeplabv3 import _deeplabv3_mobilenetv3

    torch.manual_seed(SEED)
    backbone = tv.models.mobilenet_v3_large(weights=None, dilated=True, width_mult=0.25 if small else 1.0)
    model = _deeplabv3_mobilenetv3(backbone, num_classes=21, aux=False).eval()
    _randomise_norms(model)
    size = 64 if small else 520
    return ZooModel("deeplabv3_mobilenet_v3", _SegmentationOut(model).eval(), _image(size), ("x",),
                    f"torchvision deeplabv3_mobilenet_v3_large (random weights), out logits, {size}x{size}")


def densenet121(small: bool = False) -> ZooModel:
    """DenseNet-121 (torchvision, 1000 classes, 224x224): its blocks concatenate up to 33 tensors.
    Small: growth 8 and blocks of (2, 18) layers, so one concat still has 19 inputs."""
    tv = _torchvision()

    torch.manual_seed(SEED)
    if small:
        model = tv.models.DenseNet(growth_rate=8, block_config=(2, 18), num_init_features=16, bn_size=2,
                                   num_classes=10)
    else:
        model = tv.models.densenet121(weights=None)
    model.eval()
    _randomise_norms(model)
    return ZooModel("densenet121", model, _image(64 if small else 224), ("x",),
                    "torchvision densenet121 (random weights), logits")


# ----------------------------------------------------------------------------------------------
# Issue 39's families: torchvision's Swin-T / Swin-V2-T / MaxViT-T / R3D-18 / FCN-ResNet50, DeBERTa-v3,
# a Phi-3-style decoder, ConvNeXt-V2-T
# ----------------------------------------------------------------------------------------------
def _torchvision_classifier(name: str, arch: str, small_kwargs: dict, size: int, small_size: int,
                            small: bool) -> ZooModel:
    """torchvision's ``arch`` (random weights, norms randomised), full size or ``small`` (``small_kwargs``
    to the architecture's class through the builder)."""
    tv = _torchvision()
    torch.manual_seed(SEED)
    model = getattr(tv.models, arch)(weights=None, **(small_kwargs if small else {})).eval()
    _randomise_norms(model)
    return ZooModel(name, model, _image(small_size if small else size), ("x",),
                    f"torchvision {arch} (random weights), logits, {small_size if small else size}x"
                    f"{small_size if small else size}")


def tv_swin_t(small: bool = False) -> ZooModel:
    """torchvision's Swin-T (224x224): torch.roll for the shifted windows, qkv split by a permute,
    relative position bias. Small (like the other torchvision classifiers here): 10 classes only."""
    return _torchvision_classifier("tv_swin_t", "swin_t", {"num_classes": 10}, 224, 224, small)


def tv_swin_v2_t(small: bool = False) -> ZooModel:
    """torchvision's Swin-V2-T (224x224, window 8): cosine attention with a learnt logit scale, the
    continuous relative position bias MLP."""
    return _torchvision_classifier("tv_swin_v2_t", "swin_v2_t", {"num_classes": 10}, 224, 224, small)


def tv_maxvit_t(small: bool = False) -> ZooModel:
    """torchvision's MaxViT-T (224x224): MBConv, block and grid attention with relative position bias."""
    return _torchvision_classifier("tv_maxvit_t", "maxvit_t", {"num_classes": 10}, 224, 224, small)


def r3d_18(small: bool = False) -> ZooModel:
    """torchvision's R3D-18 video classifier on 1x3x16x112x112 clips (3-D convolutions, batch norms,
    pooling). Small: 1x3x8x32x32."""
    tv = _torchvision()
    torch.manual_seed(SEED)
    model = tv.models.video.r3d_18(weights=None, num_classes=10 if small else 400).eval()
    _randomise_norms(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_var.fill_(0.8)
    shape = (1, 3, 8, 32, 32) if small else (1, 3, 16, 112, 112)
    clip = torch.randn(*shape, generator=torch.Generator().manual_seed(SEED + 1))
    return ZooModel("r3d_18", model, (clip,), ("x",), f"torchvision r3d_18 (random weights), logits, {shape}")


def fcn_resnet50(small: bool = False) -> ZooModel:
    """torchvision's FCN-ResNet50 (dilated ResNet-50 backbone, 21 classes, no auxiliary head), 224x224
    (64x64 small): logits upsampled to the input."""
    tv = _torchvision()
    torch.manual_seed(SEED)
    model = tv.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=False).eval()
    _randomise_norms(model)
    size = 64 if small else 224
    return ZooModel("fcn_resnet50", _SegmentationOut(model).eval(), _image(size), ("x",),
                    f"torchvision fcn_resnet50 (random weights), out logits, {size}x{size}")


def deberta_v3_base(small: bool = False) -> ZooModel:
    """DeBERTa-v3-base's sizes (``transformers`` DebertaV2Model: disentangled relative-position attention
    with log buckets, 12 layers of 768, 12 heads), sequence 128: ``input_ids`` in, last hidden state out.
    Small: 2 layers of 64, 2 heads, sequence 32."""
    from transformers import DebertaV2Config, DebertaV2Model

    layers, hidden, heads, seq = (2, 64, 2, 32) if small else (12, 768, 12, 128)
    cfg = DebertaV2Config(vocab_size=1000 if small else 128100, hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=512,
                          relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                          share_att_key=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                          position_biased_input=False, type_vocab_size=0)
    torch.manual_seed(SEED)
    return _hf("deberta_v3_base", DebertaV2Model(cfg), (_token_ids(cfg.vocab_size, seq),), ("input_ids",),
               f"HF DebertaV2Model with DeBERTa-v3-base sizes, last_hidden_state, seq {seq}")


def phi3_decoder(small: bool = False, seq: int | None = None) -> ZooModel:
    """A Phi-3-style decoder (``transformers`` Phi3Model: fused qkv and gate_up projections, RoPE over the
    whole head (partial_rotary_factor 1: the pass-through slice is empty), RMSNorm, sdpa attention) with
    GPT-2-small-like sizes: 12 layers of 768, 12 heads, MLP 2048, sequence 128. Small: 2 layers of 64."""
    from transformers import Phi3Config, Phi3Model

    if small:
        sizes = dict(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    else:
        sizes = dict(vocab_size=32064, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                     num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=4096)
    cfg = Phi3Config(**sizes, partial_rotary_factor=1.0, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    seq = seq or (32 if small else 128)
    torch.manual_seed(SEED)
    return _decoder("phi3_decoder", Phi3Model(cfg), cfg.vocab_size, seq,
                    f"HF Phi3Model (GPT-2-small sizes, partial_rotary_factor 1), last_hidden_state, seq {seq}")


def convnextv2_tiny(small: bool = False) -> ZooModel:
    """ConvNeXt-V2-T (``transformers`` ConvNextV2ForImageClassification, 1000 classes, 224x224): ConvNeXt
    blocks with Global Response Normalization. Small: widths 8-64, one block per stage, 64x64."""
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    if small:
        cfg = ConvNextV2Config(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10)
    else:
        cfg = ConvNextV2Config(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], num_labels=1000)
    torch.manual_seed(SEED)
    model = ConvNextV2ForImageClassification(cfg)
    with torch.no_grad():  # GRN's gamma and beta start at zero (an identity): make them count
        gen = torch.Generator().manual_seed(SEED + 4)
        for m in model.modules():
            if type(m).__name__ == "ConvNextV2GRN":
                m.weight.copy_(0.5 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
    return _hf("convnextv2_tiny", model, _image(64 if small else 224), ("pixel_values",),
               "HF ConvNextV2ForImageClassification (tiny), logits")


BUILDERS = {
    "resnet50": resnet50,
    "mobilenet_v3_large": mobilenet_v3_large,
    "efficientnet_b0": efficientnet_b0,
    "convnext_tiny": convnext_tiny,
    "vit_b_16": vit_b_16,
    "bert_base": bert_base,
    "gpt2": gpt2,
    "smollm_135m": smollm_135m,
    "wav2vec2_base": wav2vec2_base,
    "whisper_tiny_encoder": whisper_tiny_encoder,
    "swin_t": swin_t,
    "deeplabv3_mobilenet_v3": deeplabv3_mobilenet_v3,
    "densenet121": densenet121,
    "segformer_b0": segformer_b0,
    "tv_swin_t": tv_swin_t,
    "tv_swin_v2_t": tv_swin_v2_t,
    "tv_maxvit_t": tv_maxvit_t,
    "r3d_18": r3d_18,
    "fcn_resnet50": fcn_resnet50,
    "deberta_v3_base": deberta_v3_base,
    "phi3_decoder": phi3_decoder,
    "convnextv2_tiny": convnextv2_tiny,
}


def build(name: str, small: bool = False) -> ZooModel:
    """The model ``name`` (one of :data:`MODELS`), full size or ``small``; the same seeded weights on
    every call."""
    if name not in BUILDERS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    return BUILDERS[name](small=small)
