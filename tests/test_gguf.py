"""``bh.llm.from_gguf`` (issue 37): GGUF files of a small random Llama written by ``bench/gguf_write.py``
(the ``gguf`` package's writer and quantizer) against independent references.

* F32 files: logits of the prefill and of each decode step equal transformers' on the same model within 1e-4
  (relative to the largest logit), greedy tokens equal ``model.generate``'s; tied and separate LM heads.
* Q8_0 / Q4_0 files: every dense of the decoder stack a ``dense_wq`` node on the file's codes; logits equal
  (within 1e-4) transformers' run on the weights the ``gguf`` package's own ``dequantize`` reads from the same
  file (its query / key rows put back in Hugging Face's order by inverting the writer's permutation here), and
  within a stated bound of the float model's; ``weights="f32"`` gives the same logits with no ``dense_wq``.
* Bad files: a tensor type not supported (Q4_K), a file truncated inside a tensor or inside its header, a
  missing metadata key, a missing tensor: a FrontendError naming it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pytest

import byoc_hetero as bh

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gguf_write  # noqa: E402

LENGTH = 32
PROMPT = np.array([[5, 17, 3, 40, 120, 7]])
CONFIG = dict(vocab_size=300, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1)


@pytest.fixture(scope="module", params=[False, True], ids=["output", "tied"])
def hf_folder(request, tmp_path_factory):
    """A saved random Llama (LM head separate, or tied to the embedding) and the model."""
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, tie_word_embeddings=request.param)).eval()
    folder = tmp_path_factory.mktemp("hf")
    model.save_pretrained(folder)
    return str(folder), model


def _file(hf_folder, tmp_path, fmt: str) -> str:
    return gguf_write.write_gguf(hf_folder[0], str(tmp_path / f"m.{fmt}.gguf"), fmt)


def _step_logits(gen, tokens: np.ndarray, n: int) -> np.ndarray:
    """Logits of the prefill of ``tokens[:, :n]`` then of each later token fed one step at a time."""
    cache = gen.new_cache(1)
    rows = [gen.step(tokens[:, :n], np.array([0]), np.array([n]), cache)[0]]
    for pos in range(n, tokens.shape[1]):
        rows.append(gen.step(tokens[:, pos:pos + 1], np.array([pos]), np.array([1]), cache)[0])
    return np.stack(rows)


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
        if heads and name.endswith("weight"):
            order = gguf_write.halves_to_pairs(np.arange(w.shape[0])[:, None], heads)[:, 0]
            value = value[np.argsort(order)]  # the inverse of the writer's row permutation
        state[name] = torch.tensor(np.ascontiguousarray(value, dtype=np.float32))
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.load_state_dict(state, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


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
    got = _step_logits(gen, want[:, :-1], n)
    _close(got, floats, 1e-4)
    top2 = np.sort(floats, axis=-1)[:, -2:]  # the token equality is not vacuous: margins above the error
    assert (top2[:, 1] - top2[:, 0]).min() > 10 * np.abs(got - floats).max()


@pytest.mark.parametrize("fmt,float_bound", [("q8_0", 4e-2), ("q4_0", 6e-1)])
def test_quantized_file_runs_its_codes(hf_folder, tmp_path, fmt, float_bound):
    """dense_wq on the file's blocks equals the exact dequantize run in float (torch), tightly; the float
    model within ``float_bound`` (relative to its largest logit; measured on the separate-head model: 0.022
    for Q8_0, 0.42 for Q4_0, every 2-D weight quantized, the embedding and LM head included, as llama.cpp's
    writer does; bench/gguf_check.py compares with llama.cpp's own error on the same files)."""
    folder, model = hf_folder
    path = _file(hf_folder, tmp_path, fmt)
    tokens = model.generate(torch.tensor(PROMPT), max_new_tokens=8, do_sample=False).numpy()[:, :-1]
    n = PROMPT.shape[1]
    gen = bh.llm.from_gguf(path, max_length=LENGTH)
    assert gen.weights == f"gguf:{fmt}"
    got = _step_logits(gen, tokens, n)
    _close(got, _torch_logits(_dequantized_model(path, model), tokens, n), 1e-4)
    error = _close(got, _torch_logits(model, tokens, n), float_bound)
    assert error > 1e-4  # the file is quantized: its logits are not the float model's
    f32 = bh.llm.from_gguf(path, max_length=LENGTH, weights="f32")
    _close(_step_logits(f32, tokens, n), got, 1e-4)
    layers, lm_head = CONFIG["num_hidden_layers"], 0 if model.config.tie_word_embeddings else 1
    assert _node_counts(path)["dense_wq"] == 7 * layers + lm_head  # q k v o gate up down (+ a separate head)
    assert _node_counts(path, weights="f32")["dense_wq"] == 0


def test_unsupported_tensor_type_names_type_and_tensor(hf_folder, tmp_path, monkeypatch):
    encode = gguf_write.encode_tensor

    def q4_k_down(name, w, fmt):  # ffn_down [64, 256]: one Q4_K super-block (144 bytes) per row
        if name.endswith("layers.1.mlp.down_proj.weight"):
            return np.zeros((w.shape[0], 144), np.uint8), gguf.GGMLQuantizationType.Q4_K
        return encode(name, w, fmt)

    monkeypatch.setattr(gguf_write, "encode_tensor", q4_k_down)
    path = _file(hf_folder, tmp_path, "q8_0")
    with pytest.raises(bh.FrontendError, match=r"tensor 'blk.1.ffn_down.weight' is Q4_K; supported tensor types: "
                                               r"F32, F16, BF16, Q8_0, Q4_0"):
        bh.llm.from_gguf(path, max_length=LENGTH)


def test_truncated_file_names_the_tensor(hf_folder, tmp_path):
    path = _file(hf_folder, tmp_path, "q4_0")
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


def test_missing_metadata_key_and_tensor(hf_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf.GGUFWriter, "add_layer_norm_rms_eps", lambda self, value: None)
    path = _file(hf_folder, tmp_path, "f32")
    with pytest.raises(bh.FrontendError, match="has no metadata key 'llama.attention.layer_norm_rms_epsilon'"):
        bh.llm.from_gguf(path, max_length=LENGTH)
    monkeypatch.undo()
    add = gguf.GGUFWriter.add_tensor

    def without_ffn_norm_0(self, name, *args, **kw):
        if name != "blk.0.ffn_norm.weight":
            add(self, name, *args, **kw)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", without_ffn_norm_0)
    path = _file(hf_folder, tmp_path, "f32")
    with pytest.raises(bh.FrontendError, match="has no tensor 'blk.0.ffn_norm.weight'"):
        bh.llm.from_gguf(path, max_length=LENGTH)


def test_bad_arguments(hf_folder, tmp_path):
    path = _file(hf_folder, tmp_path, "f32")
    with pytest.raises(bh.InputError, match="weights must be None .* or 'f32', got 'int4'"):
        bh.llm.from_gguf(path, max_length=LENGTH, weights="int4")
    with pytest.raises(bh.InputError, match="max_length 4096 is longer than the model's context length 128"):
        bh.llm.from_gguf(path, max_length=4096)
