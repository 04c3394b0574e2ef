"""The decoders and engines of ``bench/generate.py``: model configs, their files for each engine, and one adapter
per engine with the same two calls.

Every adapter is loaded from files written from one Hugging Face folder (``save_pretrained`` of a seeded
random model) and offers ``generate(ids, n) -> list[int]`` (greedy, exactly ``n`` new tokens whatever the end
of sequence token, for a 1-D int64 prompt) and ``logits(ids) -> np.ndarray | None`` (the last position's logits
after the prompt, where the engine exposes them). A missing package or a missing part of our own API raises
:class:`Unavailable` with the reason, which the benchmark prints instead of a row.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 0
#: token ids below this are the specials (<unk>, <s>, </s>); prompts draw from above
FIRST_PROMPT_ID = 3


class Unavailable(Exception):
    """An engine or format that cannot run here (a package not installed, an API not merged); the message
    says why."""


# ------------------------------------------------------------------------------------------------
# Models


def model_config(name: str, small: bool):
    """The transformers config of ``name``: ``smollm_135m`` (SmolLM-135M's sizes), ``qwen2_0_5b``
    (Qwen2.5-0.5B's) or ``llama_1b`` (Llama-3.2-1B's, with its llama3 RoPE scaling); ``small``: the same
    family with 2 layers of width 64 and a vocabulary of 512 (for smoke runs)."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    if small:
        sizes = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    if name == "smollm_135m":
        sizes = sizes if small else dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         max_position_embeddings=2048)
        return LlamaConfig(**sizes, **common, rms_norm_eps=1e-5, rope_theta=10000.0)
    if name == "qwen2_0_5b":
        sizes = sizes if small else dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                         max_position_embeddings=32768)
        return Qwen2Config(**sizes, **common, rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False)
    if name == "llama_1b":
        sizes = sizes if small else dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                         max_position_embeddings=131072)
        scaling = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=8192)
        return LlamaConfig(**sizes, **common, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=scaling)
    raise ValueError(f"unknown model {name!r}; known: smollm_135m, qwen2_0_5b, llama_1b")


MODELS = ("smollm_135m", "qwen2_0_5b", "llama_1b")


def save_tokenizer(folder: str, vocab_size: int) -> None:
    """A word-level BPE tokenizer (no merges) over placeholder tokens, with <unk>/<s>/</s> at 0/1/2, saved into
    ``folder``: the exporters (ONNX Runtime GenAI's builder, optimum-intel) want one; the benchmark feeds ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(FIRST_PROMPT_ID, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")
    fast.save_pretrained(folder)


def save_model(name: str, small: bool, folder: str) -> dict:
    """Build ``name`` with seeded random weights (RMSNorm scales drawn around 1, so that no norm is an
    identity) and save it with its tokenizer as a Hugging Face folder; its config as a dict."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = model_config(name, small)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1 and "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder, cfg.vocab_size)
    return cfg.to_dict()


def prompt_ids(vocab_size: int, length: int) -> np.ndarray:
    """The benchmark's prompt: ``length`` seeded random ids above the special tokens (int64)."""
    return np.random.default_rng(SEED).integers(FIRST_PROMPT_ID, vocab_size, size=length, dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# Files for each engine


def _run(cmd: list[str], what: str, timeout: float = 3600) -> None:
    """``cmd`` offline (the exporters read the local folder; nothing may be fetched from the Hub)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise Unavailable(f"{what} failed (exit {proc.returncode}): {tail}")


def _need(module: str, package: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise Unavailable(f"{package} is not installed in {sys.executable} (pip install {package}; or run the "
                          f"engine by an interpreter that has it: generate.py --genai-python)")


#: formats made by llama.cpp's own quantizer (``llama_model_quantize``) from the F32 file: its mixes
LLAMA_MIXES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def gguf_file(hf: str, out_dir: str, fmt: str) -> str:
    """The GGUF file of ``hf`` in ``fmt`` (written once by ``gguf_write``; a mix of :data:`LLAMA_MIXES` by
    llama.cpp's quantizer from the F32 file, as ``llama-quantize`` makes the files users download)."""
    _need("gguf", "gguf")
    from gguf_write import write_gguf

    path = os.path.join(out_dir, f"model.{fmt}.gguf")
    if os.path.exists(path):
        return path
    if fmt in LLAMA_MIXES:
        _need("llama_cpp", "llama-cpp-python")
        import ctypes

        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, LLAMA_MIXES[fmt])
        source = gguf_file(hf, out_dir, "f32")
        if llama_cpp.llama_model_quantize(source.encode(), (path + ".part").encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama_model_quantize failed on {source} ({fmt})")
    else:
        write_gguf(hf, path + ".part", fmt)
    os.replace(path + ".part", path)
    return path


def _folder_once(path: str, marker: str, cmd, what: str) -> str:
    """The folder ``path``, written once by the command ``cmd(part)`` into ``path + ".part"`` and renamed when
    ``marker`` is in it (an interrupted export leaves nothing that looks done); kept where ``marker`` is."""
    if not os.path.exists(os.path.join(path, marker)):
        part = path + ".part"
        shutil.rmtree(part, ignore_errors=True)
        _run(cmd(part), what)
        if not os.path.exists(os.path.join(part, marker)):
            raise Unavailable(f"{what} exited 0 but wrote no {marker} into {part}")
        shutil.rmtree(path, ignore_errors=True)
        os.replace(part, path)
    return path


def ort_genai_folder(hf: str, out_dir: str, fmt: str) -> str:
    """ONNX Runtime GenAI's model builder run on ``hf`` for the CPU (``fp32`` or ``int4``), once."""
    _need("onnxruntime_genai", "onnxruntime-genai")
    return _folder_once(
        os.path.join(out_dir, f"ort_genai_{fmt}"), "genai_config.json",
        lambda part: [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf, "-i", hf, "-o", part,
                      "-p", fmt, "-e", "cpu", "-c", os.path.join(out_dir, "ort_genai_cache")],
        f"onnxruntime_genai.models.builder -p {fmt}")


def int4_group(hf: str) -> int:
    """NNCF's int4 group: its default 128, halved until it divides every layer's input width (the small
    configs' 64)."""
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    group = 128
    while group > 16 and (cfg["hidden_size"] % group or cfg["intermediate_size"] % group):
        group //= 2
    return group


def openvino_folder(hf: str, out_dir: str, fmt: str) -> str:
    """optimum-intel's OpenVINO export of ``hf`` (``--weight-format`` fp32, int8 or int4 by NNCF), once; by
    ``$OPTIMUM_CLI`` where set (optimum-intel may need other transformers than the rest: another environment)."""
    _need("openvino_genai", "openvino-genai")
    if not os.environ.get("OPTIMUM_CLI"):
        _need("optimum.intel", "optimum-intel")
    cli = os.environ.get("OPTIMUM_CLI") or os.path.join(os.path.dirname(sys.executable), "optimum-cli")
    extra = ["--group-size", str(int4_group(hf))] if fmt == "int4" else []
    return _folder_once(
        os.path.join(out_dir, f"openvino_{fmt}"), "openvino_model.xml",
        lambda part: [cli, "export", "openvino", "--model", hf, "--task", "text-generation-with-past",
                      "--weight-format", fmt, *extra, part],
        f"optimum-cli export openvino --weight-format {fmt}")


# ------------------------------------------------------------------------------------------------
# Engines


class HF:
    """transformers' own ``generate`` (eager, ``torch.set_num_threads``, inference mode)."""

    def __init__(self, hf: str, fmt: str, threads: int, max_length: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[fmt]
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(hf, dtype=dtype).eval()

    def generate(self, ids: np.ndarray, n: int) -> list[int]:
        x = self.torch.from_numpy(ids[None])
        with self.torch.inference_mode():
            out = self.model.generate(x, attention_mask=self.torch.ones_like(x), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    def logits(self, ids: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.from_numpy(ids[None])).logits[0, -1].float().numpy()


def ours_format(fmt: str) -> tuple[str, int | None]:
    """``bh.llm.from_hf``'s (weights, group_size) of one of our formats: ``"int8_g32"`` -> ("int8", 32)
    (int8 codes, a float16 scale per block of 32 along K: GGUF's Q8_0 form), ``"int8_pc"`` -> ("int8", -1)
    (one scale per output channel, whatever the default), ``"int8"`` -> ("int8", None) (the default grouping,
    ``byoc_hetero.quant.weight_only.DEFAULT_GROUP_SIZE``)."""
    if fmt.endswith("_pc"):
        return fmt[:-3], -1
    weights, _, group = fmt.partition("_g")
    return weights, int(group) if group else None


class Ours:
    """byoc-hetero's generation API, ``bh.llm.from_hf`` (issue 36)."""

    def __init__(self, hf: str, fmt: str, threads: int, max_length: int):
        import importlib.util

        if importlib.util.find_spec("byoc_hetero") is None:
            raise Unavailable("byoc_hetero is not installed")
        if importlib.util.find_spec("byoc_hetero.llm") is None:
            raise Unavailable("byoc_hetero.llm is missing in this build (the generation API, issue 36, "
                              "is not merged yet)")
        import byoc_hetero.llm as llm
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        weights, group = ours_format(fmt)
        self.gen = llm.from_hf(model, max_length=max_length, weights=weights, group_size=group)
        del model
        gc.collect()

    def generate(self, ids: np.ndarray, n: int) -> list[int]:
        out = np.asarray(self.gen.generate(ids[None], n, do_sample=False))
        return out[0, len(ids):].tolist()

    def logits(self, ids: np.ndarray) -> np.ndarray | None:
        """The prompt's last logits through the generator's one-step call (``new_cache`` / ``step``, beside
        issue 36's API) where it has it."""
        if not (hasattr(self.gen, "step") and hasattr(self.gen, "new_cache")):
            return None
        out = self.gen.step(ids[None], np.zeros(1, dtype=np.int64), np.array([len(ids)], dtype=np.int64),
                            self.gen.new_cache(1))
        return np.asarray(out, dtype=np.float32)[0]


class OursGguf(Ours):
    """byoc-hetero on llama.cpp's own file: ``bh.llm.from_gguf`` (Q8_0 / Q4_0 as ``dense_wq`` nodes)."""

    def __init__(self, gguf: str, fmt: str, threads: int, max_length: int):
        import importlib.util

        if importlib.util.find_spec("byoc_hetero.llm.gguf") is None:
            raise Unavailable("byoc_hetero.llm.from_gguf is missing in this build (issue 37's GGUF reader)")
        import byoc_hetero.llm as llm

        self.gen = llm.from_gguf(gguf, max_length=max_length)


class LlamaCpp:
    """llama.cpp through ``llama-cpp-python`` on a GGUF file of the same weights; greedy by argmax of the
    last logits after each ``eval`` (so the end-of-sequence token does not stop it)."""

    def __init__(self, gguf: str, fmt: str, threads: int, max_length: int):
        _need("llama_cpp", "llama-cpp-python")
        from llama_cpp import Llama

        self.llm = Llama(model_path=gguf, n_ctx=max_length, n_batch=max_length, n_ubatch=max_length,
                         n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        ptr = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def generate(self, ids: np.ndarray, n: int) -> list[int]:
        self.llm.reset()
        self.llm.eval(ids.tolist())
        out = []
        for k in range(n):
            tok = int(np.argmax(self._last_logits()))
            out.append(tok)
            if k + 1 < n:
                self.llm.eval([tok])
        return out

    def logits(self, ids: np.ndarray) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids.tolist())
        return self._last_logits().copy()


class OrtGenAI:
    """ONNX Runtime GenAI on its model builder's folder; threads through ``genai_config.json``'s session
    options, greedy with ``min_length`` = ``max_length`` (the end of sequence does not stop it)."""

    def __init__(self, folder: str, fmt: str, threads: int, max_length: int):
        import onnxruntime_genai as og

        cfg_path = os.path.join(folder, "genai_config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        opts = cfg["model"]["decoder"].setdefault("session_options", {})
        opts.update(intra_op_num_threads=threads, inter_op_num_threads=1)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2)
        self.og = og
        self.model = og.Model(folder)

    def _generator(self, length: int):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=1)
        return self.og.Generator(self.model, params)

    def generate(self, ids: np.ndarray, n: int) -> list[int]:
        g = self._generator(len(ids) + n)
        g.append_tokens(ids.astype(np.int32)[None])
        while not g.is_done():
            g.generate_next_token()
        return [int(t) for t in g.get_sequence(0)[len(ids):]]

    def logits(self, ids: np.ndarray) -> np.ndarray:
        g = self._generator(len(ids) + 1)
        g.append_tokens(ids.astype(np.int32)[None])
        return np.asarray(g.get_output("logits"), dtype=np.float32)[0, -1]


class OpenVINOGenAI:
    """OpenVINO GenAI's ``LLMPipeline`` on optimum-intel's export; ``ignore_eos`` and ``min_new_tokens``;
    f32 inference precision and KV cache for the fp32 export (OpenVINO's defaults for the compressed ones); prefix
    caching off, so that a repeated prompt is computed again as in every other engine."""

    def __init__(self, folder: str, fmt: str, threads: int, max_length: int):
        import openvino as ov
        import openvino_genai as ov_genai

        props = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
        if fmt == "fp32":
            props["KV_CACHE_PRECISION"] = "f32"
        self.ov, self.ov_genai, self.folder, self.props = ov, ov_genai, folder, props
        # Prefix caching is on by default in LLMPipeline's CPU scheduler: the bench's repeated prompt then hits the
        # cache and its "prefill" times a lookup (session 12, SmolLM fp32, 2 threads: 45 ms for 128 tokens with it,
        # 240 ms without; a varied prompt took 260 ms either way). Every other engine recomputes the prompt.
        sched = ov_genai.SchedulerConfig()
        sched.enable_prefix_caching = False
        self.pipe = ov_genai.LLMPipeline(folder, "CPU", scheduler_config=sched, **props)

    def generate(self, ids: np.ndarray, n: int) -> list[int]:
        cfg = self.ov_genai.GenerationConfig()
        cfg.max_new_tokens = cfg.min_new_tokens = n
        cfg.ignore_eos = True
        cfg.do_sample = False
        x = self.ov.Tensor(np.ascontiguousarray(ids[None]))
        res = self.pipe.generate(x, cfg)
        toks = list(res.tokens[0])
        return [int(t) for t in (toks[len(ids):] if len(toks) == len(ids) + n else toks)]

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """The prompt's last logits (``LLMPipeline`` does not expose them): the same exported IR compiled by
        OpenVINO itself with the pipeline's properties, one inference of the stateful model on the prompt."""
        core = self.ov.Core()
        compiled = core.compile_model(os.path.join(self.folder, "openvino_model.xml"), "CPU", self.props)
        n = len(ids)
        feed = {"input_ids": ids[None], "attention_mask": np.ones((1, n), dtype=np.int64),
                "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)}
        wanted = {name for port in compiled.inputs for name in port.get_names()}
        request = compiled.create_infer_request()
        request.infer({k: v for k, v in feed.items() if k in wanted})
        return np.array(request.get_tensor("logits").data[0, -1], dtype=np.float32)


#: engine -> (adapter, the formats it runs, the default ones, how its files are made from the HF folder)
ENGINES = {
    "ours": (Ours, ("f32", "bf16", "int8", "int4", "int8_pc", "int8_g32", "int8_g64", "int8_g128", "int4_g64",
                    "int4_g128"),
             ("f32",), None),
    "ours_gguf": (OursGguf, ("f32", "f16", "q8_0", "q4_0", "q4_k_m"), ("q8_0", "q4_0"), gguf_file),
    "hf": (HF, ("f32", "bf16"), ("f32",), None),
    "llama_cpp": (LlamaCpp, ("f32", "f16", "q8_0", "q4_0", "q4_k_m"), ("f32", "f16", "q8_0", "q4_0"), gguf_file),
    "ort_genai": (OrtGenAI, ("fp32", "int4"), ("fp32", "int4"), ort_genai_folder),
    "openvino_genai": (OpenVINOGenAI, ("fp32", "int8", "int4"), ("fp32", "int8", "int4"), openvino_folder),
}
#: engines whose workers run under ``generate.py --genai-python`` where given (their packages may live in
#: another environment than ours: OpenVINO GenAI's does here)
GENAI_ENGINES = ("ort_genai", "openvino_genai")
LABELS = {"ours": "ours (bh.llm)", "ours_gguf": "ours (bh.llm.from_gguf)", "hf": "transformers generate", "llama_cpp": "llama.cpp",
          "ort_genai": "ONNX Runtime GenAI", "openvino_genai": "OpenVINO GenAI"}
#: nominal bytes per weight of each format (Q8_0: 32 int8 + an f16 scale; Q4_0: 32 nibbles + an f16 scale;
#: ORT GenAI's int4: blocks of 32 with an f32 scale; NNCF's int8 per channel, int4 groups of 128 with f16 scales;
#: ours' grouped int8 / int4 (int8_g32, ...): an f16 scale per group, as from_hf writes them)
WIDTH = {"f32": 4.0, "fp32": 4.0, "bf16": 2.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "int8": 1.0,
         "int4": 0.5 + 4 / 32, "q4_k_m": 144 / 256,  # Q4_K_M: Q4_K's (the mix has Q5_0 / Q6_K / Q8_0 tensors too)
         "int8_pc": 1.0, "int8_g32": 1 + 2 / 32, "int8_g64": 1 + 2 / 64, "int8_g128": 1 + 2 / 128, "int4_g64": 0.5 + 2 / 64,
         "int4_g128": 0.5 + 2 / 128}
#: where an engine's format label reads other bytes than WIDTH's (shared by several engines): ours' int8 / int4
#: defaults, blocks of 32 with an f16 scale (weight_only.DEFAULT_GROUP_SIZE, since session 17 for int8); OpenVINO
#: GenAI's NNCF int4, groups of 128 with f16 scales
ENGINE_WIDTH = {("ours", "int8"): 1 + 2 / 32, ("ours", "int4"): 0.5 + 2 / 32, ("openvino_genai", "int4"): 0.5 + 2 / 128}


def width(engine: str, fmt: str) -> float:
    """Nominal bytes per weight that ``engine`` reads in ``fmt``."""
    return ENGINE_WIDTH.get((engine, fmt), WIDTH[fmt])


def load_engine(engine: str, hf: str, files_dir: str, fmt: str, threads: int, max_length: int):
    """The adapter of ``engine`` in ``fmt`` on the files made from ``hf`` (made once, kept in ``files_dir``)."""
    cls, formats, _, make_files = ENGINES[engine]
    if fmt not in formats:
        raise Unavailable(f"{engine} has no format {fmt!r} (it has {', '.join(formats)})")
    source = hf if make_files is None else make_files(hf, files_dir, fmt)
    return cls(source, fmt, threads, max_length)
