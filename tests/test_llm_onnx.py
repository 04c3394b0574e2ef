"""bh.llm.from_onnx: ONNX Runtime GenAI model builder files (GroupQueryAttention, MatMul / MatMulNBits)
against ONNX Runtime running the same file with its own past / present loop.

The files are written by ``python -m onnxruntime_genai.models.builder`` from Hugging Face folders of small
random Llama and Qwen2 configs (``save_pretrained`` of a model built from a config and a word-level
tokenizer: nothing downloads). The reference is ``onnxruntime.InferenceSession`` on the file: the prompt
with empty past tensors, then one token at a time with the previous step's present tensors as past.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import byoc_hetero as bh

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai (its model builder writes the files) not installed")

VOCAB = 96  # not the intermediate size: the builder then mistakes a gate projection for the LM head
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.4)
PROMPT = np.array([[5, 17, 3, 40, 89, 7], [60, 2, 11, 90, 33, 1]], dtype=np.int64)
MAX_LENGTH = 32

BUILD = """
import runpy, sys
for folder, out, precision in {jobs!r}:
    sys.argv = ["builder", "-i", folder, "-o", out, "-p", precision, "-e", "cpu", "-c", {cache!r}]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
"""


def _hf_folder(root: Path, family: str) -> Path:
    """A Hugging Face folder of a small random decoder with a word-level tokenizer (what the builder reads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rms_norm_eps=1e-5))
    else:  # Qwen2: q / k / v biases (made nonzero: the builder drops all-zero ones), tied embedding
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, rms_norm_eps=1e-6,
                                                                       tie_word_embeddings=True))
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    folder = root / f"hf_{family}"
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                         eos_token="t2").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """{"llama": fp32 file, "llama_int4": the builder's int4 (MatMulNBits) file, "qwen2": fp32, tied, biases,
    "qwen2_int4" (its embedding a GatherBlockQuantized of the int4 LM head); "hf_qwen2": the Qwen2 folder}."""
    root = tmp_path_factory.mktemp("onnx_llm")
    llama, qwen = _hf_folder(root, "llama"), _hf_folder(root, "qwen2")
    out = {"llama": root / "llama", "llama_int4": root / "llama_int4", "qwen2": root / "qwen2",
           "qwen2_int4": root / "qwen2_int4"}
    jobs = [(str(llama), str(out["llama"]), "fp32"), (str(llama), str(out["llama_int4"]), "int4"),
            (str(qwen), str(out["qwen2"]), "fp32"), (str(qwen), str(out["qwen2_int4"]), "int4")]
    done = subprocess.run([sys.executable, "-c", BUILD.format(jobs=jobs, cache=str(root / "cache"))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**{k: v / "model.onnx" for k, v in out.items()}, "hf_qwen2": qwen}


_GENS: dict[tuple[str, str | None], bh.llm.Generator] = {}


def _gen(files, name: str, weights: str | None = None) -> bh.llm.Generator:
    if (name, weights) not in _GENS:
        _GENS[name, weights] = bh.llm.from_onnx(files[name], max_length=MAX_LENGTH, weights=weights)
    return _GENS[name, weights]


class _OrtLoop:
    """ONNX Runtime on the file with its own past / present loop (no padding: equal-length rows)."""

    def __init__(self, path: Path):
        self.sess = ort.InferenceSession(str(path))
        self.names = [o.name for o in self.sess.get_outputs()]
        past = [i for i in self.sess.get_inputs() if i.name.startswith("past_key_values.")]
        self.layers = len(past) // 2

    def run(self, tokens: np.ndarray, past: list[np.ndarray] | None) -> tuple[np.ndarray, list[np.ndarray]]:
        """(the last row's logits [B, vocab], the presents) after ``tokens`` [B, S]."""
        b = tokens.shape[0]
        if past is None:
            empty = (b, COMMON["num_key_value_heads"], 0, COMMON["hidden_size"] // COMMON["num_attention_heads"])
            past = [np.zeros(empty, np.float32) for _ in range(2 * self.layers)]
        total = past[0].shape[2] + tokens.shape[1]
        feed = {"input_ids": tokens, "attention_mask": np.ones((b, total), np.int64)}
        for i in range(self.layers):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
        out = dict(zip(self.names, self.sess.run(None, feed)))
        return out["logits"][:, -1], [out[f"present.{i}.{kv}"] for i in range(self.layers) for kv in ("key", "value")]

    def forced(self, prompt: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """Logits [steps, B, vocab]: the prompt's, then after each column of ``nxt`` [B, n] in turn."""
        logits, past = self.run(prompt, None)
        out = [logits]
        for j in range(nxt.shape[1]):
            logits, past = self.run(nxt[:, j:j + 1], past)
            out.append(logits)
        return np.stack(out)

    def greedy(self, prompt: np.ndarray, new: int) -> np.ndarray:
        logits, past = self.run(prompt, None)
        tokens = [logits.argmax(-1)]
        for _ in range(new - 1):
            logits, past = self.run(tokens[-1][:, None].astype(np.int64), past)
            tokens.append(logits.argmax(-1))
        return np.concatenate([prompt, np.stack(tokens, axis=1)], axis=1)


def _ours_forced(gen: bh.llm.Generator, prompt: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Our logits for the same steps as :meth:`_OrtLoop.forced`, through ``gen.step`` and one cache."""
    b, s = prompt.shape
    cache = gen.new_cache(b)
    out = [gen.step(prompt, np.zeros(b, np.int64), np.full(b, s, np.int64), cache)]
    for j in range(nxt.shape[1]):
        out.append(gen.step(nxt[:, j:j + 1], np.full(b, s + j, np.int64), np.ones(b, np.int64), cache))
    return np.stack(out)


NEXT = np.array([[8, 90, 4, 4, 63, 21, 9, 77], [1, 2, 3, 50, 95, 94, 0, 64]], dtype=np.int64)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_prefill_and_decode_steps_match_onnxruntime(files, name):
    want = _OrtLoop(files[name]).forced(PROMPT, NEXT)
    got = _ours_forced(_gen(files, name), PROMPT, NEXT)
    assert np.abs(want).max() > 0.1  # logits that say something
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_tokens_equal_onnxruntime(files, name):
    want = _OrtLoop(files[name]).greedy(PROMPT, 12)
    np.testing.assert_array_equal(_gen(files, name).generate(PROMPT, max_new_tokens=12), want)


def test_the_file_is_read_into_the_models_sizes_rope_and_biases(files):
    from byoc_hetero.llm.onnx import read_decoder

    spec, params, positions = read_decoder(files["qwen2"])
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate, spec.vocab) == (
        2, 64, 4, 2, 16, 128, VOCAB)
    assert spec.qkv_bias and positions == COMMON["max_position_embeddings"]
    assert spec.eps == pytest.approx(1e-6) and spec.rope_scale == 1.0
    hf = transformers.Qwen2ForCausalLM.from_pretrained(files["hf_qwen2"])
    np.testing.assert_allclose(spec.inv_freq, hf.model.rotary_emb.inv_freq.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(params["l1.k_bias"],
                                  hf.model.layers[1].self_attn.k_proj.bias.detach().numpy())
    np.testing.assert_array_equal(params["lm_head"], params["embed"])  # tied


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_int4_matmulnbits_file_within_1_25x_onnxruntimes_error(files, name, monkeypatch):
    """The builder's int4 file (MatMulNBits, kept quantized: dense_wq; Qwen2's tied embedding a
    GatherBlockQuantized of the LM head's codes) against ONNX Runtime on the float file, within 1.25x
    ONNX Runtime's own error on the int4 file (its accuracy_level 4 also quantizes activations)."""
    ref = _OrtLoop(files[name]).forced(PROMPT, NEXT)
    theirs = _OrtLoop(files[f"{name}_int4"]).forced(PROMPT, NEXT)
    ours = _ours_forced(_gen(files, f"{name}_int4"), PROMPT, NEXT)
    ort_error, our_error = np.abs(theirs - ref).max(), np.abs(ours - ref).max()
    assert 0 < our_error <= 1.25 * ort_error, (our_error, ort_error)
    # dequantized at build (weights="f32") computes what the dense_wq nodes compute on float32 activations
    dq = _ours_forced(_gen(files, f"{name}_int4", "f32"), PROMPT, NEXT)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    exact = _ours_forced(bh.llm.from_onnx(files[f"{name}_int4"], max_length=MAX_LENGTH), PROMPT, NEXT)  # not cached
    np.testing.assert_allclose(exact, dq, rtol=0, atol=1e-4 * np.abs(dq).max())


def test_int4_file_runs_its_codes_as_dense_wq_nodes_of_the_regions(files):
    from collections import Counter

    from byoc_hetero._relax import region_table
    from byoc_hetero.llm.onnx import read_decoder

    spec, params, _ = read_decoder(files["llama_int4"])
    part, label, error = bh.llm.partitioned_weights(spec, params, max_length=MAX_LENGTH)
    assert label == "int4" and error is None
    ops = sum((Counter(n["op"] for n in r.graph["nodes"]) for r in region_table(part).values()), Counter())
    layers = COMMON["num_hidden_layers"]
    assert ops["dense_wq"] == 7 * layers + 1, ops  # q k v o gate up down, and the LM head (MatMulNBits too)
    assert ops["kv_attention"] == layers and ops["dense"] == 0, ops


def test_save_and_load_an_onnx_generator(files, tmp_path):
    gen = _gen(files, "qwen2")
    loaded = bh.llm.load(gen.save(tmp_path / "g"))
    np.testing.assert_array_equal(loaded.generate(PROMPT, max_new_tokens=5), gen.generate(PROMPT, max_new_tokens=5))


# ---- bad files --------------------------------------------------------------------------------------------------
def _edited(files, tmp_path, edit, name: str = "edited.onnx") -> Path:
    import onnx

    model = onnx.load(str(files["llama"]))
    edit(model)
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _set_attr(node, name, value):
    from onnx import helper

    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _gqa(model, i=0):
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention"][i]


def test_a_file_without_past_and_present_is_a_frontend_error(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["input_ids"], ["logits"])], "plain",
                              [helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph), str(tmp_path / "plain.onnx"))
    with pytest.raises(bh.FrontendError, match="past_key_values.N.key"):
        bh.llm.from_onnx(tmp_path / "plain.onnx", max_length=8)


@pytest.mark.parametrize("attr,value", [("rotary_interleaved", 1), ("softcap", 30.0), ("do_rotary", 0),
                                        ("local_window_size", 0)])
def test_a_gqa_attribute_the_step_does_not_implement_names_the_node(files, tmp_path, attr, value):
    path = _edited(files, tmp_path, lambda m: _set_attr(_gqa(m, 1), attr, value))
    with pytest.raises(bh.FrontendError, match=f"layers.1/attn/GroupQueryAttention.*GroupQueryAttention.*{attr}"):
        bh.llm.from_onnx(path, max_length=8)


def test_a_scale_other_than_one_over_sqrt_head_dim_is_a_frontend_error(files, tmp_path):
    path = _edited(files, tmp_path, lambda m: _set_attr(_gqa(m), "scale", 0.5))
    with pytest.raises(bh.FrontendError, match="scale 1 / sqrt"):
        bh.llm.from_onnx(path, max_length=8)


def test_another_activation_names_the_node_and_what_was_expected(files, tmp_path):
    def edit(model):
        next(n for n in model.graph.node if n.op_type == "Sigmoid").op_type = "Tanh"

    with pytest.raises(bh.FrontendError, match=r"expected .*Sigmoid\(gate\).*got .*gate_proj.* read by Tanh"):
        bh.llm.from_onnx(_edited(files, tmp_path, edit), max_length=8)


def test_corrupted_cos_cache_is_a_frontend_error(files, tmp_path):
    from onnx import numpy_helper

    def edit(model):
        init = next(i for i in model.graph.initializer if i.name == "cos_cache")
        value = numpy_helper.to_array(init).copy()
        value[5, 3] += 0.1
        init.CopyFrom(numpy_helper.from_array(value, "cos_cache"))

    with pytest.raises(bh.FrontendError, match="cos / sin caches of RoPE"):
        bh.llm.from_onnx(_edited(files, tmp_path, edit), max_length=8)


def test_weight_choices_that_do_not_fit_the_file_are_input_errors(files):
    with pytest.raises(bh.InputError, match="cos / sin caches"):
        bh.llm.from_onnx(files["llama"], max_length=COMMON["max_position_embeddings"] + 1)
    with pytest.raises(bh.InputError, match="quantized already"):
        bh.llm.from_onnx(files["llama_int4"], max_length=8, weights="int8")


def _to_matmul_nbits(model, bits: int, block: int, accuracy_level: int = 0) -> None:
    """Every MatMul on a weight of ``model`` as a MatMulNBits with zero points (``bits``, ``block``), the
    weights quantized by byoc_hetero's quantize_matrix (uint8 codes with a zero point per block);
    ``accuracy_level`` 4 asks ONNX Runtime to quantize the activations to int8 too."""
    from onnx import helper, numpy_helper

    from byoc_hetero.quant.weight_only import quantize_matrix

    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]])  # [K, N]
        k, n = w.shape
        c = quantize_matrix(w.T, bits, block, zero_points=True)
        zp = c.zero_points
        if bits == 4:  # two a byte, the even block low; a row's count rounded up
            zp = np.pad(zp, ((0, 0), (0, zp.shape[1] % 2)))
            zp = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
        name = node.input[1]
        model.graph.initializer.extend([
            numpy_helper.from_array(c.codes.reshape(n, k // block, block * bits // 8), f"{name}.q"),
            numpy_helper.from_array(c.scales.reshape(-1), f"{name}.s"),
            numpy_helper.from_array(zp.reshape(-1), f"{name}.z")])
        new = helper.make_node("MatMulNBits", [node.input[0], f"{name}.q", f"{name}.s", f"{name}.z"],
                               list(node.output), name=node.name + "_nbits", domain="com.microsoft",
                               K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy_level)
        node.CopyFrom(new)


@pytest.mark.parametrize("bits,block", [(4, 16), (8, 32)])
def test_matmul_nbits_with_zero_points_matches_onnxruntime(files, tmp_path, bits, block, monkeypatch):
    """MatMulNBits of other widths and blocks, with zero points (the builder writes int4 block 32 without):
    ONNX Runtime (accuracy_level 0: float compute) on the same file is the reference of our float-activation
    path (``BYOC_HETERO_WQ_ACT=f32``), to float rounding; our default (int8 activations where the block is a
    multiple of 32, as llama.cpp's Q8_0 activations) within 1.25x the error ONNX Runtime's own int8
    activations (accuracy_level 4) make against that reference."""
    path = _edited(files, tmp_path, lambda m: _to_matmul_nbits(m, bits, block))
    want = _OrtLoop(path).forced(PROMPT, NEXT)
    default = _ours_forced(bh.llm.from_onnx(path, max_length=MAX_LENGTH), PROMPT, NEXT)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    gen = bh.llm.from_onnx(path, max_length=MAX_LENGTH)
    assert gen.weights == f"int{bits}"
    np.testing.assert_allclose(_ours_forced(gen, PROMPT, NEXT), want, rtol=0, atol=1e-4 * np.abs(want).max())
    if block % 32 == 0:  # the int8-activation path: an error of the size ONNX Runtime's int8 compute makes
        level4 = _edited(files, tmp_path, lambda m: _to_matmul_nbits(m, bits, block, accuracy_level=4), "level4.onnx")
        ort_error = np.abs(_OrtLoop(level4).forced(PROMPT, NEXT) - want).max()
        our_error = np.abs(default - want).max()
        assert 0 < our_error <= 1.25 * ort_error, (our_error, ort_error)
    else:  # blocks that are not a multiple of 32 stay on the float path
        np.testing.assert_array_equal(default, _ours_forced(gen, PROMPT, NEXT))


def test_a_local_window_attends_what_onnxruntime_attends(files, tmp_path):
    """local_window_size W (Mistral's sliding window as the builder writes it): ONNX Runtime attends W
    keys, the query's own position included (as transformers' sliding_window); prefill of 6 and 8 decode
    steps cross a window of 3."""
    def edit(model):
        for node in model.graph.node:
            if node.op_type == "GroupQueryAttention":
                _set_attr(node, "local_window_size", 3)

    path = _edited(files, tmp_path, edit)
    gen = bh.llm.from_onnx(path, max_length=MAX_LENGTH)
    assert gen.spec.sliding_window == 3
    want = _OrtLoop(path).forced(PROMPT, NEXT)
    np.testing.assert_allclose(_ours_forced(gen, PROMPT, NEXT), want, rtol=0, atol=2e-5 * np.abs(want).max())
    full = _OrtLoop(files["llama"]).forced(PROMPT, NEXT)
    assert np.abs(full - want).max() > 1e-2 * np.abs(want).max()  # the window changes the logits


def test_layers_with_different_windows_are_a_frontend_error(files, tmp_path):
    path = _edited(files, tmp_path, lambda m: _set_attr(_gqa(m, 1), "local_window_size", 3))
    with pytest.raises(bh.FrontendError, match="layer 1's attention .*window 3.* differs from layer 0's"):
        bh.llm.from_onnx(path, max_length=8)


def test_an_unreadable_file_is_a_model_file_error(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(bh.errors.ModelFileError, match="not a readable ONNX file"):
        bh.llm.from_onnx(tmp_path, max_length=8)  # the folder: its model.onnx


def test_matmul_nbits_with_a_nan_scale_names_the_node(files, tmp_path):
    from onnx import numpy_helper

    def edit(model):
        init = next(i for i in model.graph.initializer if i.name.endswith("o_proj.MatMul.weight_scales"))
        value = numpy_helper.to_array(init).copy()
        value.flat[3] = np.nan
        init.CopyFrom(numpy_helper.from_array(value, init.name))

    import onnx

    model = onnx.load(str(files["llama_int4"]))
    edit(model)
    onnx.save(model, str(tmp_path / "nan.onnx"))
    with pytest.raises(bh.FrontendError, match=r"o_proj/MatMul_Q4.*\(MatMulNBits\).*scales.*nan"):
        bh.llm.from_onnx(tmp_path / "nan.onnx", max_length=8)


def test_cli_generate_from_an_onnxruntime_genai_folder(files, capsys):
    from byoc_hetero.cli import main

    folder = files["llama_int4"].parent
    assert main(["generate", str(folder), "--ids", "5,17,3,40", "--max-new-tokens", "6", "--max-length", "32"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    want = _gen(files, "llama_int4").generate(np.array([[5, 17, 3, 40]]), max_new_tokens=6, stop=2)[0, 4:]
    assert printed == want[:len(printed)].tolist() and len(printed) >= 1


def test_a_branch_the_walk_does_not_read_is_a_frontend_error(files, tmp_path):
    """A node hanging off a block (here an extra graph output of layer 0's post-attention norm): its
    meaning would be dropped, so the file is refused naming it."""
    from onnx import TensorProto, helper

    def edit(model):
        norm = next(n for n in model.graph.node if n.name.endswith("layers.0/post_attention_layernorm/SkipLayerNorm"))
        model.graph.node.append(helper.make_node("Relu", [norm.output[0]], ["extra"], name="extra_relu"))
        model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))

    with pytest.raises(bh.FrontendError, match="'extra_relu' \\(Relu\\).*no part of the blocks read"):
        bh.llm.from_onnx(_edited(files, tmp_path, edit), max_length=8)
