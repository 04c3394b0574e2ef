"""Command line ``byoc-hetero`` (also ``python -m byoc_hetero``).

Commands: ``demo`` (the README's main job), ``report MODEL.onnx`` (the partition report, optionally
the picture), ``run MODEL.onnx --input x.npy`` (run the offloaded build; ``run model.so`` runs an
exported library, its file structure checked before loading), ``bench MODEL.onnx``
(offloaded vs llvm-only latency), ``tune MODEL.onnx`` (``bh.tune``: decisions measured on this
machine, a progress bar on stderr, the tuning report; ``-o lib.so`` writes the tuned library),
``serve LIB.so`` (Ray Serve), ``generate FOLDER --ids 1,2,3`` (``bh.llm``: tokens from a Hugging
Face decoder folder or a saved generator, streamed), ``info`` (versions, oneDNN ISA, kernels). ``report``, ``run`` and
``bench`` take ``--quantize DIR``: the float model is first quantized to int8 by
:func:`byoc_hetero.quantize`, calibrated on the samples in ``DIR`` (docs/quantize.md).

Exit codes: 0 success; 2 bad usage or bad input (argparse, a missing or corrupt model or input
file, a wrong input count, shape or dtype, an index out of range: :class:`~byoc_hetero.errors.InputError`,
:class:`~byoc_hetero.errors.ModelFileError`, a malformed scale or zero point of a quantized model:
:class:`~byoc_hetero.errors.QuantizationError`, a damaged library:
:class:`~byoc_hetero.errors.IntegrityError`); 3 a model TVM cannot import
(:class:`~byoc_hetero.errors.UnsupportedModelError`); 1 anything else, TVM's own errors included
(whatever their Python class: TVM raises ``ValueError`` for its internal failures too). Every error
is one line on stderr: ``byoc-hetero: error: ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .errors import (ByocError, InputError, IntegrityError, ModelFileError, QuantizationError,
                     UnsupportedModelError, first_line)
from .quant.weight_only import DEFAULT_GROUP_SIZE, PER_CHANNEL

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_UNSUPPORTED = 0, 1, 2, 3


def _multiple_of_32(text: str) -> int:
    """``--image-size``: a positive multiple of 32 (VGG-11 halves it five times); else a usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or value % 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive multiple of 32")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``byoc-hetero: error: ...`` and exit 2, like every other error
    (argparse's own prints the usage block first). Subcommand parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        hint = f" (see {self.prog} --help)"
        print(f"byoc-hetero: error: {message}{hint}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)


def _dim_value(text: str) -> tuple[str, int]:
    """``--dim N=8``: a symbolic dim's name and a positive size; else a usage error."""
    name, _, value = text.partition("=")
    if not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SIZE with a positive SIZE")
    return name, int(value)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="byoc-hetero",
        description="Offload conv2d/dense regions of TVM Relax models to oneDNN; the rest runs on llvm.",
        epilog="exit codes: 0 ok, 2 bad usage or input, 3 model cannot be imported, 1 internal error",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="VGG-11 through the four partition stages, then latency")
    demo.add_argument("--image-size", type=_multiple_of_32, default=224, help="input height/width (multiple of 32)")
    demo.add_argument("--repeat", type=int, default=3, help="timed runs of the llvm-only build")

    report = sub.add_parser("report", help="partition an ONNX model and print what went where, and why")
    report.add_argument("model", type=Path, help="the .onnx file")
    report.add_argument("--render", type=Path, metavar="PICTURE",
                        help="also draw the partitioned graph: .svg or .html (interactive) with pip "
                             "packages only, .dot as text, .png/.pdf through graphviz's dot")

    run = sub.add_parser("run", help="run an ONNX model with its regions offloaded, or an exported library")
    run.add_argument("model", type=Path, help="the .onnx file, or a library exported with export_library (.so)")
    run.add_argument("--input", type=Path, action="append", required=True, metavar="X.npy",
                     help="an input as a .npy file (repeat for several inputs, in order)")
    run.add_argument("--output", type=Path, metavar="Y.npy", help="save the (first) output here")

    bench = sub.add_parser("bench", help="latency of an ONNX model: offloaded vs llvm-only")
    bench.add_argument("model", type=Path, help="the .onnx file")
    bench.add_argument("--repeat", type=int, default=5, help="timed runs per build")
    bench.add_argument("--input", type=Path, action="append", metavar="X.npy",
                       help="an input as a .npy file (repeat for several inputs, in order); needed for a "
                            "model with symbolic dims, whose sizes the inputs' shapes pick")
    bench.add_argument("--dim", type=_dim_value, action="append", default=[], metavar="NAME=SIZE",
                       help="the size of a symbolic dim for random inputs (default: the lower end of its "
                            "declared range, else 1)")

    for command in (report, run, bench):
        command.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                             help="what offloaded conv2d/dense/matmul compute in (bf16: bf16 weights and "
                                  "activations, f32 accumulation, float32 inputs/outputs; runs f32 with a "
                                  "warning on CPUs without native bf16)")
        command.add_argument("--quantize", type=Path, metavar="DIR",
                             help="first quantize the float model to int8 with bh.quantize, calibrated on the "
                                  "inputs in DIR: one .npy file per sample (one-input models) or one .npz per "
                                  "sample with an array per input name")
        command.add_argument("--quantize-method", choices=("minmax", "percentile", "entropy"), default="minmax",
                             help="how --quantize calibrates activation ranges (default minmax)")

    _add_tune(sub)

    srv = sub.add_parser("serve", help="serve an exported library on Ray Serve (pip install \"byoc-hetero[serve]\")")
    srv.add_argument("library", type=Path, nargs="?", help="a library from byoc_hetero.serve.export (or an "
                                                           ".onnx file); its name is the file's stem")
    srv.add_argument("--model", action="append", default=[], metavar="NAME[:VERSION]=PATH",
                     help="a model to serve (repeatable; after LIBRARY if both are given)")
    srv.add_argument("--max-request-mb", type=float, default=64.0, help="larger request bodies get HTTP 413")
    srv.add_argument("--replicas", type=_positive, default=1, help="number of replicas")
    srv.add_argument("--cpus", type=_positive, default=1, help="CPUs per replica (its runtime threads)")
    srv.add_argument("--batch", action="store_true", help="batch concurrent requests (symbolic-batch build)")
    srv.add_argument("--max-batch-rows", type=_positive, default=16, help="rows per batched call")
    srv.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits to fill")
    srv.add_argument("--port", type=_positive, default=8000, help="HTTP port on 127.0.0.1")
    srv.add_argument("--engine", choices=("byoc", "onnxruntime"), default=None,
                     help="default: onnxruntime for .onnx files, byoc otherwise")

    sub.add_parser("info", help="versions, oneDNN ISA, native bf16 and the runtime's kernels")
    _add_generate(sub)
    return parser


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="generate tokens with a decoder (bh.llm): a Hugging Face model folder, "
                                          "an ONNX past/present decoder or a generator saved with gen.save")
    gen.add_argument("model", type=Path, help="a folder: a transformers ...ForCausalLM (config.json + weights, "
                                              "built here), an ONNX Runtime GenAI folder (model.onnx) or a "
                                              "generator saved by Generator.save; or a decoder .onnx file")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--ids", type=_token_ids, help="the prompt as token ids, comma-separated")
    prompt.add_argument("--prompt", help="the prompt as text (needs the model folder's tokenizer)")
    gen.add_argument("--max-new-tokens", type=_positive, default=32, help="tokens to generate (default 32)")
    gen.add_argument("--max-length", type=_positive, default=512,
                     help="cache length when building from a Hugging Face folder (default 512)")
    gen.add_argument("--weights", choices=("f32", "bf16", "int8", "int4"), default=None,
                     help="weight precision when building (int8/int4: weight-only quantized decoder denses "
                          "and LM head; default f32, an ONNX file's own: its MatMulNBits kept)")
    gen.add_argument("--group-size", type=int, choices=(-1, 32, 64, 128),
                     help="int8/int4: consecutive k per scale, -1 one scale per output channel (default: "
                          + ", ".join(f"{f} {'per output channel' if g == PER_CHANNEL else g}"
                                      for f, g in DEFAULT_GROUP_SIZE.items()) + ")")
    gen.add_argument("--lm-head", choices=("int8", "int4", "f32"), default=None,
                     help="int8/int4: the LM head's format (default: the --weights one; f32 keeps it float)")
    gen.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", type=_token_ids, help="token ids that end the sequence (default: the model's eos)")
    gen.add_argument("--save", type=Path, metavar="DIR", help="also save the built generator to DIR (bh.llm.load)")


def _token_ids(text: str) -> list[int]:
    """``--ids 1,2,3``: token ids; else a usage error."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        ids = []
    if not ids:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated token ids")
    return ids


def _add_tune(sub) -> None:
    tune = sub.add_parser("tune", help="partition with decisions measured on this machine (bh.tune); print the "
                                       "tuning report; optionally write the tuned library")
    tune.add_argument("model", type=Path, help="the .onnx file")
    tune.add_argument("-o", "--output", type=Path, metavar="LIB.so",
                      help="write the tuned module as a library (load it with bh.load_module or 'run LIB.so')")
    tune.add_argument("--cache", type=Path, metavar="FILE",
                      help="the timing cache (JSON; read when it was written on this machine with these library "
                           "versions, else ignored with a warning; saved after tuning). Without it, timings are "
                           "kept in memory only")
    tune.add_argument("--precisions", nargs="+", choices=("f32", "bf16", "int8"), default=["f32"],
                      metavar="P", help="precisions to choose among (f32, bf16, int8; default f32)")
    tune.add_argument("--tolerance", type=float, help="the precision level's error bound relative to float32")
    tune.add_argument("--calibration", type=Path, metavar="DIR",
                      help="inputs for the precision level's error: one .npy (one-input models) or .npz per sample")
    tune.add_argument("--shape", type=_input_shape, action="append", default=[], metavar="NAME=D1,D2,...",
                      help="fix an input's shape (tuning times static shapes; a symbolic batch needs a size)")
    tune.add_argument("--repeat", type=_positive, default=15, help="timed calls per candidate (default 15)")
    tune.add_argument("--guard-rounds", type=_positive, default=3,
                      help="alternating rounds of the end-to-end check against the default plan (default 3)")


def _input_shape(text: str) -> tuple[str, list[int]]:
    """``--shape x=1,3,224,224``: an input's name and its dims; else a usage error."""
    name, _, dims = text.partition("=")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        shape = []
    if not name or not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D1,D2,... with positive dims")
    return name, shape


def _positive(text: str) -> int:
    """A positive integer; else a usage error."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _cmd_serve(args) -> None:
    """Start the deployment and serve until interrupted (Ctrl-C or SIGTERM shut Serve and Ray down)."""
    import signal

    from . import serve

    def interrupt(*_):
        raise KeyboardInterrupt

    models = ([str(args.library)] if args.library else []) + args.model
    if not models:
        raise InputError("serve: give a LIBRARY or --model NAME=PATH")
    application = serve.app(models, engine=args.engine, replicas=args.replicas, cpus=args.cpus,
                            batch=args.batch, max_batch_rows=args.max_batch_rows,
                            batch_wait_s=args.batch_wait_ms / 1e3,
                            max_request_bytes=int(args.max_request_mb * (1 << 20)))
    _progress(f"starting Ray Serve: {args.replicas} replica(s) x {args.cpus} CPU(s) ...")
    serve.start(application, port=args.port)
    signal.signal(signal.SIGTERM, interrupt)  # after Ray's start, which installs its own handler
    print(f"serving {', '.join(models)} on http://127.0.0.1:{args.port}/ (KServe v2 at /v2, metrics at "
          "/metrics; POST / .npy, .npz or JSON; GET /info); Ctrl-C stops", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _load_calibration(folder: Path) -> list:
    """--quantize DIR: the samples, in file name order (InputError for a missing folder, no samples or
    an unreadable file)."""
    import numpy as np

    if not folder.is_dir():
        raise InputError(f"calibration folder {str(folder)!r} does not exist")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz"))
    if not files:
        raise InputError(f"calibration folder {str(folder)!r} holds no .npy or .npz file")
    samples = []
    for path in files:
        try:
            data = np.load(path)
            samples.append(dict(data) if path.suffix == ".npz" else data)
        except Exception as err:  # noqa: BLE001 - numpy raises several kinds for a bad file
            raise InputError(f"calibration file {str(path)!r} is not a readable numpy file: {first_line(err)}") from err
    return samples


def _load_and_partition(path: Path, precision: str = "f32", quantize: Path | None = None,
                        method: str = "minmax"):
    import byoc_hetero as bh

    start = time.perf_counter()
    _progress(f"importing {path} ...")
    mod, params = bh.from_onnx(path)
    if quantize is not None:
        samples = _load_calibration(quantize)
        _progress(f"quantizing on {len(samples)} calibration inputs ({method}) ...")
        mod, params = q = bh.quantize(mod, params, calibration=samples, method=method, verbose=False)
        _progress(f"  {q.summary()}")
    m = bh.bind_params(mod, params)
    for stage in bh.stages(precision=precision):
        t = time.perf_counter()
        m = stage(m)
        _progress(f"  {stage.info.name:<22} {time.perf_counter() - t:6.2f} s")
    _progress(f"partitioned in {time.perf_counter() - start:.1f} s")
    return mod, params, m


def _build(m, what: str):
    from .timing import build

    _progress(f"compiling the {what} build ...")
    start = time.perf_counter()
    ex = build(m)
    _progress(f"  done in {time.perf_counter() - start:.1f} s")
    return ex


def _cmd_report(args) -> None:
    import byoc_hetero as bh

    if args.render:
        _check_picture_path(args.render)  # before the work, so a bad name costs nothing
    _, _, m = _load_and_partition(args.model, args.precision, args.quantize, args.quantize_method)
    rep = bh.report(m)
    print(rep)
    if args.render:
        print(f"picture: {rep.render(args.render)}")


def _check_picture_path(path: Path) -> None:
    """InputError for a picture ``report --render`` cannot write here: an unknown suffix, or one that
    needs graphviz's ``dot`` where it is not installed (.svg, .html and .dot need nothing more)."""
    import shutil

    suffix = path.suffix.lower().lstrip(".")
    if suffix in ("svg", "html", "htm", "dot", "gv"):
        return
    if suffix not in ("png", "pdf", "jpg", "ps"):
        raise InputError(f"--render {path}: write .svg, .html or .dot (or .png/.pdf with graphviz)")
    if shutil.which("dot") is None:
        raise InputError(f"--render {path}: .{suffix} needs graphviz's 'dot' program, which is not installed; "
                         ".svg and .html need nothing more")


def _load_inputs(paths: list[Path]) -> list:
    """The .npy files given with --input, in order (InputError for a missing or unreadable one)."""
    import numpy as np

    inputs = []
    for path in paths:
        if not path.is_file():
            raise InputError(f"input file {str(path)!r} does not exist")
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
        if head != _NPY_MAGIC:
            raise InputError(f"input file {str(path)!r} is not a readable .npy file: it does not start with NumPy's "
                             f"header (it starts with {head[:6]!r}); write one with numpy.save")
        try:
            inputs.append(np.load(path, allow_pickle=False))
        except Exception as err:  # noqa: BLE001 - numpy raises several kinds for a bad file
            raise InputError(f"input file {str(path)!r} is not a readable .npy array: {first_line(err)}") from err
    return inputs


_NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of every .npy file (NumPy's format spec); a text file named .npy lacks them."""


def _run_library(path: Path, inputs: list):
    """Run ``main`` of an exported library (``export_library``'s .so) on ``inputs``: the file's
    structure is checked before it is loaded (:func:`byoc_hetero.load_module`)."""
    import tvm
    from tvm import relax

    from .library import load_module

    vm = relax.VirtualMachine(load_module(path), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def _cmd_run(args) -> None:
    import numpy as np

    from .inputs import check_inputs
    from .timing import run

    inputs = _load_inputs(args.input)
    if args.model.suffix == ".so":
        out = _run_library(args.model, inputs)
    else:
        mod, params, m = _load_and_partition(args.model, args.precision, args.quantize, args.quantize_method)
        check_inputs(mod, inputs, params)
        out = run(_build(m, "offloaded"), inputs)
    if args.output:
        np.save(args.output, out)
        print(f"output {list(out.shape)} {out.dtype} saved to {args.output}")
    else:
        np.set_printoptions(threshold=20, edgeitems=3)
        print(out)


def _cmd_bench(args) -> None:
    import byoc_hetero as bh

    from .inputs import check_inputs
    from .timing import median_latency, relative_error, run

    mod, params, m = _load_and_partition(args.model, args.precision, args.quantize, args.quantize_method)
    if args.input:
        inputs = _load_inputs(args.input)  # their shapes pick the sizes of a dynamic model
        check_inputs(mod, inputs, params)
    else:
        inputs = _bench_inputs(mod, params, dict(args.dim))
    ex_off = _build(m, "offloaded")
    ex_ref = _build(bh.bind_params(mod, params), "llvm-only")
    err = relative_error(run(ex_off, inputs), run(ex_ref, inputs))
    _progress("timing ...")
    t_off = median_latency(ex_off, inputs, repeat=args.repeat)
    t_ref = median_latency(ex_ref, inputs, repeat=args.repeat)
    print(f"offloaded  {t_off * 1e3:10.2f} ms")
    print(f"llvm-only  {t_ref * 1e3:10.2f} ms")
    print(f"speed-up   {t_ref / t_off:10.1f}x   (max relative difference {err:.1e})")


def _bench_inputs(mod, params, given: dict[str, int]) -> list:
    """Random inputs for ``bench``: a symbolic dim takes its ``--dim`` size, else the lower end of its
    declared range, else 1 (a note on stderr says which sizes were picked)."""
    import numpy as np

    from .inputs import dim_ranges, signature

    ranges, rng, picked, inputs = dim_ranges(mod["main"]), np.random.default_rng(1), {}, []
    for spec in signature(mod["main"], params):
        if spec is None or spec.shape is None or None in spec.shape:
            raise InputError(f"main: input {spec.name if spec else '?'!r} has a shape bench cannot pick "
                             "sizes for; give the inputs to time with --input X.npy")
        shape = []
        for d in spec.shape:
            if isinstance(d, str):
                picked[d] = given.get(d) or picked.get(d) or (ranges.get(d, (None, None))[0] or 1)
                d = picked[d]
            shape.append(d)
        dtype = np.dtype(spec.dtype or "float32")
        # small non-negative integers: valid token ids and indices for integer inputs
        data = rng.integers(0, 2, shape) if dtype.kind in "iub" else rng.standard_normal(shape)
        inputs.append(data.astype(dtype))
    unknown = sorted(set(given) - set(picked))
    if unknown:
        raise InputError(f"--dim {', '.join(unknown)}: no such symbolic dim (the model has: "
                         f"{', '.join(sorted(picked)) or 'none'})")
    if picked:
        _progress("note: symbolic dims timed at " + ", ".join(f"{k}={v}" for k, v in sorted(picked.items()))
                  + " (--dim NAME=SIZE or --input X.npy for other sizes; default: the lower end of the "
                  "declared range, else 1)")
    return inputs


def _cmd_tune(args) -> None:
    """Tune, print the report, write the library when asked (and check it loads back)."""
    import byoc_hetero as bh

    from .library import load_module
    from .tune.progress import ProgressBar

    if args.output is not None and args.output.suffix != ".so":
        raise InputError(f"-o {args.output}: the tuned library is a shared object; name it .so")
    start = time.perf_counter()
    _progress(f"importing {args.model} ...")
    mod, params = bh.from_onnx(args.model, shape=dict(args.shape) or None)
    calibration = _load_calibration(args.calibration) if args.calibration else None
    bar = ProgressBar()
    try:
        m, report = bh.tune(mod, params, precisions=tuple(args.precisions), tolerance=args.tolerance,
                            calibration=calibration, cache=args.cache, repeat=args.repeat,
                            guard_rounds=args.guard_rounds, progress=bar)
    finally:
        bar.close()
    _progress(f"tuned in {time.perf_counter() - start:.1f} s")
    print(report)
    if args.output is not None:
        _build(m, "tuned").export_library(str(args.output))
        load_module(args.output)  # what a user will do next: fails here, not later, for a bad file
        print(f"tuned library: {args.output} (bh.load_module, or byoc-hetero run {args.output} --input X.npy)")


def exit_code(err: BaseException) -> int:
    """The exit code for an error that ended a command: decided by our exception classes only."""
    if isinstance(err, UnsupportedModelError):
        return EXIT_UNSUPPORTED
    if isinstance(err, InputError | ModelFileError | QuantizationError | IntegrityError):
        return EXIT_INPUT
    return EXIT_INTERNAL


def _cmd_generate(args) -> None:
    """Build (or load) a generator and stream its tokens to stdout: text with a tokenizer, else ids."""
    import numpy as np

    from . import llm

    folder = args.model
    if (folder / llm.generator.MANIFEST).is_file():
        gen, tokenizer, eos = llm.load(folder), None, None
    elif folder.suffix == ".onnx" or (folder / "model.onnx").is_file():
        gen, tokenizer, eos = _onnx_generator(args)
    elif (folder / "config.json").is_file():
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype="float32")
        gen = llm.from_hf(model, max_length=args.max_length, weights=args.weights or "f32",
                          group_size=args.group_size, lm_head=args.lm_head)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        tokenizer = None
        if args.prompt is not None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    else:
        raise ModelFileError(f"{folder} holds neither a generator (generator.json), an ONNX decoder (model.onnx) "
                             "nor a Hugging Face model (config.json)")
    if args.save is not None:
        gen.save(args.save)
    if args.prompt is not None and tokenizer is None:
        raise InputError("--prompt needs a tokenizer: give a Hugging Face model folder with one, or use --ids")
    ids = args.ids if args.prompt is None else tokenizer(args.prompt)["input_ids"]
    stop = args.stop if args.stop is not None else eos
    stream = gen.stream(np.array([ids], dtype="int64"), args.max_new_tokens, do_sample=args.sample,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=stop)
    for step in stream:
        token = int(step[0])
        print(tokenizer.decode([token]) if tokenizer else token, end="" if tokenizer else " ", flush=True)
    print()


def _onnx_generator(args) -> tuple:
    """(generator, tokenizer or None, eos or None) for ``generate`` on an ONNX decoder file or an ONNX
    Runtime GenAI folder (``model.onnx``, ``genai_config.json``, its tokenizer files)."""
    import json

    from . import llm

    gen = llm.from_onnx(args.model, max_length=args.max_length, weights=args.weights, group_size=args.group_size)
    folder = args.model.parent if args.model.suffix == ".onnx" else args.model
    config = folder / "genai_config.json"
    eos = json.loads(config.read_text()).get("model", {}).get("eos_token_id") if config.is_file() else None
    tokenizer = None
    if args.prompt is not None and (folder / "tokenizer.json").is_file():
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return gen, tokenizer, eos


def _describe(err: BaseException) -> str:
    """For stderr: our messages as they are, anything else as its class name and first line."""
    if isinstance(err, ByocError):
        return str(err)
    return f"{type(err).__name__}: {first_line(err)}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        import byoc_hetero as bh  # imported late: TVM takes a moment to load

        if args.command == "demo":
            from .demo import demo

            demo(image_size=args.image_size, repeat=args.repeat)
        elif args.command == "report":
            _cmd_report(args)
        elif args.command == "run":
            _cmd_run(args)
        elif args.command == "bench":
            _cmd_bench(args)
        elif args.command == "tune":
            _cmd_tune(args)
        elif args.command == "serve":
            _cmd_serve(args)
        elif args.command == "generate":
            _cmd_generate(args)
        elif args.command == "info":
            c = bh._C
            print(f"byoc_hetero {bh.__version__}, oneDNN {c.onednn_version()} ({c.isa()}), "
                  f"bf16 {'native' if c.bf16_native() else 'not native (precision=bf16 runs f32)'}, "
                  f"kernels: {', '.join(c.kernels())}")
    except Exception as err:  # noqa: BLE001 - every failure becomes one line and an exit code
        print(f"byoc-hetero: error: {_describe(err)}", file=sys.stderr)
        return exit_code(err)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
