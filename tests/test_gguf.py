"""``bh.llm.from_gguf`` (issue 37): GGUF files of a small random Llama written by ``bench/gguf_write.py``
(the ``gguf`` package's writer and quantizer) against independent references.

* F32 files: logits of the prefill and of each decode step equal transformers' on the same model within 1e-4
  (relative to the largest logit), greedy tokens equal ``model.generate``'s; tied and separate LM heads.
* Q8_0 / Q4_0 files: every dense of the decoder stack and the LM head (tied: the embedding's codes) a
  ``dense_wq`` node on the file's codes; logits equal
  (within 1e-4) transformers' run on the weights the ``gguf`` package's own ``dequantize`` reads from the same
  file (its query / key rows put back in Hugging Face's order by inverting the writer's permutation here), and
  within a stated bound of the float model's; ``weights="f32"`` gives the same logits with no ``dense_wq``.
* Q5_0 / Q4_1 / Q5_1 / Q4_K / Q5_K blocks read exactly as the ``gguf`` package dequantizes them; a
  K-quant file (``bench/gguf_write.py``'s own Q4_K / Q5_K quantizer, llama.cpp's fallback types where a
  row does not split into super-blocks of 256) runs its codes as ``dense_wq`` nodes with offsets.
* Q2_K / Q3_K / IQ4_NL blocks read exactly as the ``gguf`` package dequantizes them (random blocks: it has no
  quantizer for them), and denses of those types run as ``dense_wq`` nodes.
* Bad files: a tensor type not supported (IQ4_XS), a file truncated inside a tensor or inside its header, a
  missing metadata key, a missing tensor: a FrontendError naming it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pytest

import byoc_hetero as bh
from reference import step_logits

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gguf_write  # noqa: E402

LENGTH = 32
PROMPT = np.array([[5, 17, 3, 40, 120, 7]])
CONFIG = dict(vocab_size=300, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1)


_SAVED: dict = {}


def _saved(tmp_path_factory, key: str, cls=None, **overrides):
    """A random decoder (``cls``, default Llama, CONFIG with ``overrides``) with norms and biases drawn away from
    their defaults, saved once per module run: (folder, model)."""
    if key not in _SAVED:
        cls = cls or transformers.LlamaForCausalLM
        torch.manual_seed(1)
        model = cls(cls.config_class(**(CONFIG | overrides))).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 1:
                    p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
        folder = tmp_path_factory.mktemp(key)
        model.save_pretrained(folder)
        _SAVED[key] = (str(folder), model)
    return _SAVED[key]


@pytest.fixture(scope="module", params=[False, True], ids=["output", "tied"])
def hf_folder(request, tmp_path_factory):
    """A saved random Llama (LM head separate, or tied to the embedding) and the model."""
    return _saved(tmp_path_factory, f"llama_tied{request.param}", tie_word_embeddings=request.param)


@pytest.fixture(scope="module")
def one_folder(tmp_path_factory):
    """The Llama with a separate LM head (the bad-file tests)."""
    return _saved(tmp_path_factory, "llama_tiedFalse", tie_word_embeddings=False)


def _file(hf_folder, tmp_path, fmt: str) -> str:
    return gguf_write.write_gguf(hf_folder[0], str(tmp_path / f"m.{fmt}.gguf"), fmt)


def _torch_logits(model, tokens: np.ndarray, n: int) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits[0, n - 1:].numpy()


def _dequantized_model(path: str, like):
    """``like`` with the weights the gguf package dequantizes from ``path`` (rows of q / k back in order)."""
    from gguf.quants import dequantize

    cfg = like.config
    tensors = {t.name: dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(path).tensors}
    state = {}
    for name, w in like.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        value = tensors[gguf_write.gguf_name(name)].reshape(w.shape)
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        if heads and name.endswith("weight") and cfg.model_type == "llama":
            order = gguf_write.halves_to_pairs(np.arange(w.shape[0])[:, None], heads)[:, 0]
            value = value[np.argsort(order)]  # the inverse of the writer's row permutation
        state[name] = torch.tensor(np.ascontiguousarray(value, dtype=np.float32))
    model = type(like)(cfg).eval()
    model.load_state_dict(state, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


@pytest.mark.parametrize("family", ["qwen2", "llama3_rope"])
def test_other_families_f32_equal_transformers(tmp_path_factory, tmp_path, family):
    """Qwen2 (q / k / v biases, rows not reordered) and Llama 3's RoPE scaling (the rope_freqs divisors)."""
    if family == "qwen2":
        hf = _saved(tmp_path_factory, "qwen2", transformers.Qwen2ForCausalLM, use_sliding_window=False)
    else:
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=32)
        hf = _saved(tmp_path_factory, "llama3", rope_scaling=scaling, rope_theta=500000.0)
    gen = bh.llm.from_gguf(_file(hf, tmp_path, "f32"), max_length=LENGTH)
    tokens = hf[1].generate(torch.tensor(PROMPT), max_new_tokens=20, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    _close(step_logits(gen, tokens, n), _torch_logits(hf[1], tokens, n), 1e-4)  # positions up to 25 > 8


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_f16_bf16_files_equal_their_weights_in_float(one_folder, tmp_path, monkeypatch, fmt):
    """Half-precision files: the logits of transformers run on the gguf package's reading of the same file."""
    if fmt == "bf16":  # the writer has no bf16: the 2-D weights truncated to their top 16 bits
        encode = gguf_write.encode_tensor

        def bf16(name, w, _fmt):
            if w.ndim == 1:
                return encode(name, w, "f32")
            bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32) >> 16
            return bits.astype(np.uint16).view(np.uint8).reshape(w.shape[0], -1), gguf.GGMLQuantizationType.BF16

        monkeypatch.setattr(gguf_write, "encode_tensor", bf16)
    path = gguf_write.write_gguf(one_folder[0], str(tmp_path / "m.gguf"), "f16")
    types = {t.type for t in bh.llm.gguf.GgufFile(path).tensors.values()}
    assert types == {"F32", fmt.upper()}, types
    tokens = one_folder[1].generate(torch.tensor(PROMPT), max_new_tokens=6, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    got = step_logits(bh.llm.from_gguf(path, max_length=LENGTH), tokens, n)
    _close(got, _torch_logits(_dequantized_model(path, one_folder[1]), tokens, n), 1e-4)


def _close(got: np.ndarray, want: np.ndarray, bound: float) -> float:
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    assert rel <= bound, rel
    return rel


def _node_counts(path: str, **kw) -> Counter:
    from byoc_hetero._relax import region_table

    part = bh.llm.gguf.partitioned_gguf(path, max_length=LENGTH, **kw)[0]
    return sum((Counter(n["op"] for n in r.graph["nodes"]) for r in region_table(part).values()), Counter())


def test_f32_file_logits_and_tokens_equal_transformers(hf_folder, tmp_path):
    _, model = hf_folder
    gen = bh.llm.from_gguf(_file(hf_folder, tmp_path, "f32"), max_length=LENGTH)
    assert gen.weights == "gguf:f32" and gen.spec.vocab == 300 and gen.spec.kv_heads == 2
    want = model.generate(torch.tensor(PROMPT), max_new_tokens=10, do_sample=False).numpy()
    np.testing.assert_array_equal(gen.generate(PROMPT, max_new_tokens=10), want)
    n = PROMPT.shape[1]
    floats = _torch_logits(model, want[:, :-1], n)
    got = step_logits(gen, want[:, :-1], n)
    _close(got, floats, 1e-4)
    top2 = np.sort(floats, axis=-1)[:, -2:]  # the token equality is not vacuous: margins above the error
    assert (top2[:, 1] - top2[:, 0]).min() > 10 * np.abs(got - floats).max()


@pytest.mark.parametrize("fmt,float_bound", [("q8_0", 4e-2), ("q4_0", 6e-1)])
def test_quantized_file_runs_its_codes(hf_folder, tmp_path, fmt, float_bound, monkeypatch):
    """dense_wq on the file's blocks with float32 activations (BYOC_HETERO_WQ_ACT=f32) equals the exact
    dequantize run in float (torch), tightly; with int8 activations per block of 32 (the default, as
    llama.cpp's Q8_0 activations) the float model within ``float_bound`` (relative to its largest
    logit; measured 0.023-0.026 for Q8_0, 0.39-0.40 for Q4_0: a random model's logits are flat, and every
    2-D weight is quantized, the embedding and LM head included, as llama.cpp's writer does;
    bench/gguf_check.py compares with llama.cpp's own error)."""
    folder, model = hf_folder
    path = _file(hf_folder, tmp_path, fmt)
    tokens = model.generate(torch.tensor(PROMPT), max_new_tokens=8, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    gen = bh.llm.from_gguf(path, max_length=LENGTH)
    assert gen.weights == f"gguf:{fmt}"
    error = _close(step_logits(gen, tokens, n), _torch_logits(model, tokens, n), float_bound)
    assert error > 1e-4  # the file is quantized: its logits are not the float model's
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    got = step_logits(bh.llm.from_gguf(path, max_length=LENGTH), tokens, n)
    _close(got, _torch_logits(_dequantized_model(path, model), tokens, n), 1e-4)
    f32 = bh.llm.from_gguf(path, max_length=LENGTH, weights="f32")
    _close(step_logits(f32, tokens, n), got, 1e-4)
    assert _node_counts(path)["dense_wq"] == 7 * CONFIG["num_hidden_layers"] + 1  # q k v o gate up down, head
    assert _node_counts(path, weights="f32")["dense_wq"] == 0


@pytest.mark.parametrize("fmt,bound", [("q8_0", 2e-2), ("q4_0", 1e-1)])
def test_tied_lm_head_is_a_dense_wq_on_the_embeddings_codes(tmp_path_factory, tmp_path, fmt, bound):
    """A file without ``output.weight`` (SmolLM's tied head): the LM head reads ``token_embd.weight``'s
    codes as a ``dense_wq`` node (llama.cpp reads it in the file's type; an f32 dense over the dequantized
    table would read 8x / 4x the bytes), the embedding's take its dequantized rows; the logits (int8
    activations, the default) within ``bound`` of the same file dequantized to f32 (relative to its largest
    logit: the int8 activations' rounding, larger against 4-bit weights)."""
    from byoc_hetero._relax import region_table

    folder, model = _saved(tmp_path_factory, "llama_tiedTrue", tie_word_embeddings=True)
    path = _file((folder, model), tmp_path, fmt)
    table = bh.llm.gguf.GgufFile(path).tensors
    assert "output.weight" not in table and table["token_embd.weight"].type == fmt.upper()
    part, spec, _ = bh.llm.gguf.partitioned_gguf(path, max_length=LENGTH)
    assert spec.tied_embeddings
    heads = []  # every node whose output is [rows, vocab]: the LM head
    for region in region_table(part).values():
        tensors = region.graph["tensors"]
        for node in region.graph["nodes"]:
            if tensors[node["output"]]["shape"][-1] == CONFIG["vocab_size"]:
                heads.append((node["op"], tensors[node["inputs"][1]]))
    assert len(heads) == 1 and heads[0][0] == "dense_wq", heads
    width = 8 if fmt == "q8_0" else 4  # the codes' bytes: [vocab, hidden * bits / 8], not float32
    assert heads[0][1]["shape"] == [CONFIG["vocab_size"], CONFIG["hidden_size"] * width // 8], heads
    assert heads[0][1]["dtype"] in ("int8", "uint8"), heads
    tokens = model.generate(torch.tensor(PROMPT), max_new_tokens=8, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    want = step_logits(bh.llm.from_gguf(path, max_length=LENGTH, weights="f32"), tokens, n)
    error = _close(step_logits(bh.llm.from_gguf(path, max_length=LENGTH), tokens, n), want, bound)
    assert error > 1e-6  # the int8 activations round: not the float run itself


def test_unsupported_tensor_type_names_type_and_tensor(one_folder, tmp_path, monkeypatch):
    encode = gguf_write.encode_tensor

    def iq4_xs_down(name, w, fmt):  # ffn_down [64, 256]: one IQ4_XS super-block (136 bytes) per row
        if name.endswith("layers.1.mlp.down_proj.weight"):
            return np.zeros((w.shape[0], 136), np.uint8), gguf.GGMLQuantizationType.IQ4_XS
        return encode(name, w, fmt)

    monkeypatch.setattr(gguf_write, "encode_tensor", iq4_xs_down)
    path = _file(one_folder, tmp_path, "q8_0")
    with pytest.raises(bh.FrontendError, match=r"tensor 'blk.1.ffn_down.weight' is IQ4_XS; supported tensor types: "
                                               r"F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K, "
                                               r"Q2_K, Q3_K, IQ4_NL"):
        bh.llm.from_gguf(path, max_length=LENGTH)


def test_truncated_file_names_the_tensor(one_folder, tmp_path):
    path = _file(one_folder, tmp_path, "q4_0")
    table = bh.llm.gguf.GgufFile(path).tensors
    last = max(table.values(), key=lambda t: t.offset)
    cut = tmp_path / "cut.gguf"
    data = open(path, "rb").read()
    cut.write_bytes(data[:last.offset + last.nbytes // 2])
    with pytest.raises(bh.FrontendError, match=rf"ends inside tensor '{last.name}' .*truncated"):
        bh.llm.from_gguf(cut, max_length=LENGTH)
    cut.write_bytes(data[:200])  # inside the metadata
    with pytest.raises(bh.FrontendError, match="ends inside its header .*truncated"):
        bh.llm.from_gguf(cut, max_length=LENGTH)
    cut.write_bytes(b"GGML" + data[4:])
    with pytest.raises(bh.FrontendError, match="not a GGUF file"):
        bh.llm.from_gguf(cut, max_length=LENGTH)


def test_missing_or_bad_metadata_key_and_missing_tensor(one_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf.GGUFWriter, "add_layer_norm_rms_eps", lambda self, value: None)
    path = _file(one_folder, tmp_path, "f32")
    with pytest.raises(bh.FrontendError, match="has no metadata key 'llama.attention.layer_norm_rms_epsilon'"):
        bh.llm.from_gguf(path, max_length=LENGTH)
    monkeypatch.undo()
    monkeypatch.setattr(gguf.GGUFWriter, "add_head_count",
                        lambda self, count: self.add_string("llama.attention.head_count", "four"))
    path = _file(one_folder, tmp_path, "f32")
    with pytest.raises(bh.FrontendError, match="'llama.attention.head_count' is 'four'; expected a positive integer"):
        bh.llm.from_gguf(path, max_length=LENGTH)
    monkeypatch.undo()
    add = gguf.GGUFWriter.add_tensor

    def without_ffn_norm_0(self, name, *args, **kw):
        if name != "blk.0.ffn_norm.weight":
            add(self, name, *args, **kw)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", without_ffn_norm_0)
    path = _file(one_folder, tmp_path, "f32")
    with pytest.raises(bh.FrontendError, match="has no tensor 'blk.0.ffn_norm.weight'"):
        bh.llm.from_gguf(path, max_length=LENGTH)


def test_bad_arguments(one_folder, tmp_path):
    path = _file(one_folder, tmp_path, "f32")
    with pytest.raises(bh.InputError, match="weights must be None .* or 'f32', got 'int4'"):
        bh.llm.from_gguf(path, max_length=LENGTH, weights="int4")
    with pytest.raises(bh.InputError, match="max_length 4096 is longer than the model's context length 128"):
        bh.llm.from_gguf(path, max_length=4096)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_zero_and_nan_block_scales(one_folder, tmp_path, fmt, monkeypatch):
    """A block whose f16 scale is 0 holds zeros (stored with scale 1 and the zero code: dense_wq refuses zero
    scales), as the gguf package reads it; a NaN scale is an error naming the tensor and the block."""
    path = _file(one_folder, tmp_path, fmt)
    t = bh.llm.gguf.GgufFile(path).tensors["blk.0.attn_q.weight"]
    data = bytearray(open(path, "rb").read())
    block = 18 if fmt == "q4_0" else 34
    for b in (0, 1, 5):  # blocks of row 0 (two blocks a row of 64) and of row 2
        data[t.offset + b * block:t.offset + b * block + 2] = np.float16(0).tobytes()
    zeroed = tmp_path / "zero.gguf"
    zeroed.write_bytes(bytes(data))
    tokens = one_folder[1].generate(torch.tensor(PROMPT), max_new_tokens=4, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")  # the exact float path: compared with the dequantized model
    got = step_logits(bh.llm.from_gguf(zeroed, max_length=LENGTH), tokens, n)
    _close(got, _torch_logits(_dequantized_model(str(zeroed), one_folder[1]), tokens, n), 1e-4)
    data[t.offset + 3 * block:t.offset + 3 * block + 2] = np.float16(np.nan).tobytes()
    zeroed.write_bytes(bytes(data))
    with pytest.raises(bh.FrontendError, match=r"tensor 'blk.0.attn_q.weight' block \[1, 1\] has scale nan"):
        bh.llm.from_gguf(zeroed, max_length=LENGTH)


def test_q6_k_tensor_reads_as_the_gguf_package_dequantizes(tmp_path):
    """Q6_K (llama.cpp's usual type for the LM head of a Q4_0 file) read as float32: random super-blocks
    (finite f16 d) against the gguf package's dequantize."""
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(3, 2 * 210), dtype=np.uint8)  # 3 rows of 512 weights
    d = rng.standard_normal((3, 2)).astype(np.float16).view(np.uint8).reshape(3, 2, 2)
    data.reshape(3, 2, 210)[:, :, 208:] = d
    writer = gguf.GGUFWriter(str(tmp_path / "q6k.gguf"), "llama")
    writer.add_tensor("output.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = bh.llm.gguf.GgufFile(tmp_path / "q6k.gguf")
    got = f.float32("output.weight")
    want = dequantize(data, gguf.GGMLQuantizationType.Q6_K).reshape(3, 512)
    assert got.shape == (3, 512) and np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)


def _random_blocks(kind: str, rows: int, k: int, rng) -> np.ndarray:
    """Random bytes of ``rows`` rows of ``k`` weights of type ``kind``, its f16 fields finite (one block's
    scale 0: a block of zeros, or of its offset)."""
    per, size = bh.llm.gguf.BLOCKS[kind]
    data = rng.integers(0, 256, size=(rows, k // per, size), dtype=np.uint8)
    halves = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "IQ4_NL": (0,), "Q6_K": (208,), "Q3_K": (108,),
              "Q2_K": (80, 82)}.get(kind, (0, 2))
    for at in halves:
        value = (rng.standard_normal((rows, k // per)) * 0.05).astype(np.float16)
        data[:, :, at:at + 2] = value.view(np.uint8).reshape(rows, k // per, 2)
    data[1, 0, halves[0]:halves[0] + 2] = 0  # f16 zero
    return data.reshape(rows, -1)


def _one_tensor_file(path, name: str, data: np.ndarray, kind: str) -> str:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor(name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
                                  "IQ4_NL"])
def test_block_types_read_as_the_gguf_package_dequantizes(tmp_path, kind):
    """Each block type's codes (rearranged into blocks of 32, scales, offsets) dequantize to exactly what the
    gguf package's ``dequantize`` reads from the same random bytes (K-quants: every 6-bit scale / min
    pattern, fifth bits; Q6_K / Q2_K / Q3_K's codes in blocks of 16, Q3_K's high bits and signed 6-bit
    scales; IQ4_NL's non-linear levels; a zero scale)."""
    from gguf.quants import dequantize

    from byoc_hetero.quant.weight_only import dequantize_codes

    data = _random_blocks(kind, 3, 512, np.random.default_rng(len(kind) + ord(kind[1])))
    f = bh.llm.gguf.GgufFile(_one_tensor_file(tmp_path / "t.gguf", "w", data, kind))
    codes = bh.llm.gguf.block_codes(f, "w")
    codes.check("w")
    want = dequantize(data, getattr(gguf.GGMLQuantizationType, kind)).reshape(3, 512)
    with_offsets = ("Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q2_K", "Q3_K")
    assert np.abs(want).max() > 0 and (codes.offsets is not None) == (kind in with_offsets)
    np.testing.assert_array_equal(dequantize_codes(codes), want)
    np.testing.assert_array_equal(f.float32("w"), want)


def test_q2_k_q3_k_iq4_nl_denses_run_their_codes(one_folder, tmp_path, monkeypatch):
    """A Q8_0 file with layer 0's ffn_down Q2_K, layer 1's Q3_K and layer 1's ffn_up IQ4_NL (random blocks: the
    gguf package has no quantizer for them): each a dense_wq node (4-bit codes in blocks of 16 with offsets;
    int8 codes of IQ4_NL's levels), the logits with float32 activations those of transformers on the gguf
    package's dequantize of the same file (1e-4)."""
    encode, rng = gguf_write.encode_tensor, np.random.default_rng(7)
    kinds = {"layers.0.mlp.down_proj.weight": "Q2_K", "layers.1.mlp.down_proj.weight": "Q3_K",
             "layers.1.mlp.up_proj.weight": "IQ4_NL"}

    def low_bits(name, w, fmt):
        kind = next((k for suffix, k in kinds.items() if name.endswith(suffix)), None)
        if kind is None:
            return encode(name, w, fmt)
        return _random_blocks(kind, w.shape[0], w.shape[1], rng), getattr(gguf.GGMLQuantizationType, kind)

    monkeypatch.setattr(gguf_write, "encode_tensor", low_bits)
    path = _file(one_folder, tmp_path, "q8_0")
    types = {t.name: t.type for t in bh.llm.gguf.GgufFile(path).tensors.values()}
    assert [types[f"blk.{i}.ffn_{n}.weight"] for i, n in ((0, "down"), (1, "down"), (1, "up"))] == list(kinds.values())
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    gen = bh.llm.from_gguf(path, max_length=LENGTH)
    assert gen.weights == "gguf:iq4_nl+q2_k+q3_k+q8_0", gen.weights
    tokens = np.concatenate([PROMPT, np.array([[9, 250, 31]])], axis=1)
    n = PROMPT.shape[1]
    _close(step_logits(gen, tokens, n), _torch_logits(_dequantized_model(path, one_folder[1]), tokens, n), 1e-4)
    assert _node_counts(path)["dense_wq"] == 7 * CONFIG["num_hidden_layers"] + 1


K_CONFIG = dict(hidden_size=256, intermediate_size=288, num_attention_heads=4, num_key_value_heads=2)
"""Rows of 256 (Q4_K / Q5_K super-blocks) but ffn_down's of 288: llama.cpp's fallback (Q5_0 / Q5_1) there."""


@pytest.mark.parametrize("fmt,fallback", [("q4_k", "q5_0"), ("q5_k", "q5_1")])
def test_k_quant_file_runs_its_codes(tmp_path_factory, tmp_path, monkeypatch, fmt, fallback):
    """A Llama file of K-quants (the fallback type where a row is not 256 long, the LM head Q6_K, as
    llama.cpp's mixes): every dense and the head a dense_wq node, with offsets for Q4_K / Q5_K / Q5_1 (Q5_0:
    int8 codes; Q6_K: int8 codes in blocks of 16); with float32 activations the
    logits of transformers on the gguf package's dequantize of the same file (1e-4); with int8 activations
    (the default) close to them and the greedy tokens equal wherever that run's top-2 margin exceeds twice
    the error."""
    folder, model = _saved(tmp_path_factory, "llama_k", tie_word_embeddings=False, **K_CONFIG)
    path = gguf_write.write_gguf(folder, str(tmp_path / f"m.{fmt}.gguf"), fmt)
    types = Counter(t.type for t in bh.llm.gguf.GgufFile(path).tensors.values())
    # q k v o gate up of each layer and the embedding; ffn_down (rows of 288) the fallback; the head Q6_K
    assert types[fmt.upper()] == 6 * 2 + 1 and types[fallback.upper()] == 2 and types["Q6_K"] == 1, types
    tokens = model.generate(torch.tensor(PROMPT), max_new_tokens=8, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    reference = _torch_logits(_dequantized_model(path, model), tokens, n)
    gen = bh.llm.from_gguf(path, max_length=LENGTH)
    assert gen.weights == "gguf:" + "+".join(sorted([fmt, fallback, "q6_k"]))
    got = step_logits(gen, tokens, n)
    error = _close(got, reference, 1e-1)
    top2 = np.sort(reference, axis=-1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(got - reference).max()
    assert sure.sum() >= 3, sure
    np.testing.assert_array_equal(got.argmax(-1)[sure], reference.argmax(-1)[sure])
    assert error > 1e-6  # the int8 activations round
    assert _node_counts(path)["dense_wq"] == 7 * CONFIG["num_hidden_layers"] + 1
    part = bh.llm.gguf.partitioned_gguf(path, max_length=LENGTH)[0]
    from byoc_hetero._relax import region_table

    offsets = [node["attrs"].get("has_offset") for r in region_table(part).values() for node in r.graph["nodes"]
               if node["op"] == "dense_wq"]
    assert offsets.count(1) == 6 * 2 + (2 if fallback == "q5_1" else 0), offsets
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    _close(step_logits(bh.llm.from_gguf(path, max_length=LENGTH), tokens, n), reference, 1e-4)
    _close(step_logits(bh.llm.from_gguf(path, max_length=LENGTH, weights="f32"), tokens, n), reference, 1e-4)


def test_k_quant_bad_files_name_the_tensor(tmp_path_factory, tmp_path, monkeypatch):
    """A Q4_K file truncated inside a tensor, a Q4_K tensor whose shape is not the metadata's, a Q4_K block
    with a NaN d: FrontendErrors naming the tensor."""
    folder, model = _saved(tmp_path_factory, "llama_k", tie_word_embeddings=False, **K_CONFIG)
    path = gguf_write.write_gguf(folder, str(tmp_path / "m.gguf"), "q4_k")
    table = bh.llm.gguf.GgufFile(path).tensors
    last = max((t for t in table.values() if t.type == "Q4_K"), key=lambda t: t.offset)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:last.offset + last.nbytes // 2])
    with pytest.raises(bh.FrontendError, match=rf"ends inside tensor '{last.name}' .*truncated"):
        bh.llm.gguf.block_codes(bh.llm.gguf.GgufFile(cut), last.name)
    with pytest.raises(bh.FrontendError, match="ends inside tensor .*truncated"):
        bh.llm.from_gguf(cut, max_length=LENGTH)
    t = table["blk.0.attn_q.weight"]
    bad = bytearray(data)
    bad[t.offset + 144:t.offset + 146] = np.float16(np.nan).tobytes()  # row 1's d (one super-block a row)
    cut.write_bytes(bytes(bad))
    with pytest.raises(bh.FrontendError, match=r"tensor 'blk.0.attn_q.weight' block \[1, 0\] has scale nan"):
        bh.llm.from_gguf(cut, max_length=LENGTH)
    encode = gguf_write.encode_tensor

    def short_down(name, w, fmt):  # ffn_down [256, 288] written as [256, 256] of Q4_K
        if name.endswith("layers.1.mlp.down_proj.weight"):
            return encode(name, w[:, :256], fmt)
        return encode(name, w, fmt)

    monkeypatch.setattr(gguf_write, "encode_tensor", short_down)
    path = gguf_write.write_gguf(folder, str(tmp_path / "short.gguf"), "q4_k")
    with pytest.raises(bh.FrontendError, match=r"tensor 'blk.1.ffn_down.weight' is \[256, 256\]; the metadata says "
                                               r"\[256, 288\]"):
        bh.llm.from_gguf(path, max_length=LENGTH)
