"""`grpo-replay eval`: evaluate a model on math benchmarks the way the paper does.

Example::

    grpo-replay eval --model PATH --benchmarks math500,aime25,aime26,hmmt_feb25,hmmt_feb26 --n 16 --k 1,2,4,8,16
"""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from ..app.configio import int_arg, nonempty, nonempty_path, once, path_arg
from ..errors import UsageError
from ..app.data import BENCHMARKS
from ..eval.prompts import INSTRUCTION
from ..generation import BACKENDS, SamplingParams
from ..generation.transformers import DTYPES
from ..eval.grading import DEFAULT_TIMEOUT

LOCK = ".grpo-replay-eval.lock"  # held in --out while an evaluation runs


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _name_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one benchmark")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=nonempty, help="local model directory, Hugging Face hub id or .gguf file", action=once())
    parser.add_argument("--model-file", type=nonempty, default=None, help="a GGUF file (NAME.gguf) inside the --model directory", action=once())
    parser.add_argument(
        "--benchmarks",
        action=once(),
        type=_name_list,
        default=list(BENCHMARKS),
        help=f"comma-separated benchmark names (known: {','.join(BENCHMARKS)}), JSONL paths or HF dataset ids",
    )
    parser.add_argument("--n", type=int_arg, default=16, help="samples per problem (default 16)", action=once())
    parser.add_argument("--k", type=_int_list, default=None, help="pass@k values (default 1,2,4,...,<=n)", action=once())
    parser.add_argument("--out", type=nonempty_path, default=Path("eval_results"), help="output directory", action=once())
    parser.add_argument("--baseline", type=nonempty_path, default=None, help="results.json of a baseline, for AES and length change", action=once())
    parser.add_argument("--limit", type=int_arg, default=None, help="at most N problems per benchmark", action=once())
    parser.add_argument("--data-dir", type=path_arg, default=None, help="benchmark directory (default $GRPO_REPLAY_DATA)", action=once())
    parser.add_argument("--backend", choices=BACKENDS, default="transformers", action=once())
    parser.add_argument("--temperature", type=float, default=SamplingParams.temperature, action=once())
    parser.add_argument("--top-p", type=float, default=SamplingParams.top_p, action=once())
    parser.add_argument("--max-new-tokens", type=int_arg, default=SamplingParams.max_new_tokens, action=once())
    parser.add_argument("--seed", type=int_arg, default=0, action=once())
    parser.add_argument("--batch-size", type=int_arg, default=8, help="problems per generation call", action=once())
    parser.add_argument("--no-chat-template", action="store_true", help="feed the plain prompt, no chat template")
    parser.add_argument(
        "--instruction", action=once(), default=INSTRUCTION, help="appended to each problem; use {problem} for a full template"
    )
    parser.add_argument("--device", default="auto", help="transformers backend: auto|cpu|cuda[:i]", action=once())
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="transformers backend: auto|float32|bfloat16|float16", action=once())
    parser.add_argument("--grade-workers", type=int_arg, default=None, help="grading processes (0: grade in this process; default: by batch size)", action=once())
    parser.add_argument("--grade-timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per graded answer", action=once())
    parser.add_argument("--aes-weights", type=float, nargs=3, default=(1.0, 3.0, 5.0), metavar=("ALPHA", "BETA", "GAMMA"), action=once())
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the generation cache")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _check_out(out: Path) -> None:
    """--out must be a directory or a new path (checked before any generation, so nothing is computed for naught)."""
    from ..trainer.rundir import file_in_the_way

    blocker = file_in_the_way(out)
    if blocker == out:
        raise UsageError(f"--out {out} is a file, not a directory; give a directory for the results")
    if blocker is not None:
        raise UsageError(f"--out {out} lies under {blocker}, which is a file")


def run(args: argparse.Namespace) -> int:
    """Every check that needs no model first (a bad setting, benchmark or --out raises a UsageError: exit 2 with
    nothing loaded or written), then the evaluation."""
    from ..generation.transformers import check_device
    from ..eval.benchmark_report import load_results
    from ..eval.harness import EvalSettings, load_benchmark
    from ..trainer.train_config import MAX_SEED

    if not 0 <= args.seed <= MAX_SEED:  # the range train accepts, so one seed list serves both commands
        raise UsageError(f"--seed {args.seed} is invalid; allowed: an integer in 0..{MAX_SEED}")
    if args.backend == "vllm":
        for flag, value in (("--device", args.device), ("--dtype", args.dtype)):
            if value != "auto":  # vLLM picks both itself; taking the flag silently would record what did not run
                raise UsageError(f"{flag} {value} is for --backend transformers; allowed with --backend vllm: auto")

    sampling = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    ks = args.k if args.k is not None else [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= args.n]
    settings = EvalSettings(
        benchmarks=args.benchmarks,
        ks=ks,
        sampling=sampling,
        data_dir=args.data_dir,
        limit=args.limit,
        instruction=args.instruction,
        use_chat_template=not args.no_chat_template,
        batch_size=args.batch_size,
        grade_workers=args.grade_workers,
        grade_timeout=args.grade_timeout,
        aes_weights=tuple(args.aes_weights),
        progress=not args.no_progress,
    )
    settings.validate()
    baseline = load_results(args.baseline) if args.baseline else None
    for name in settings.benchmarks:  # a missing or empty benchmark fails before the model loads
        load_benchmark(name, settings.data_dir, settings.limit)
    if args.backend == "transformers":
        check_device(args.device)
    _check_out(Path(args.out))
    from ..trainer.rundir import exclusive

    out = Path(args.out)
    created = not out.exists()
    try:
        # One evaluation at a time per --out: two would append to one cache file and overwrite each other's results.
        with exclusive(out, LOCK, "grpo-replay eval"):
            return _evaluate(args, settings, baseline)
    except BaseException:
        if created:  # a failed first evaluation (e.g. the model does not load) leaves no empty --out behind
            (out / LOCK).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _evaluate(args: argparse.Namespace, settings, baseline) -> int:
    from ..generation.transformers import TransformersGenerator, load_model
    from ..generation.vllm import VLLMGenerator
    from ..eval.benchmark_report import markdown_table, write_report
    from ..eval.harness import run_evaluation

    if args.backend == "vllm":
        from transformers import AutoTokenizer

        if args.model_file or args.model.lower().endswith(".gguf"):
            raise UsageError("--backend vllm: GGUF checkpoints are loaded through transformers here; use --backend transformers")

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        uses_template = settings.use_chat_template and getattr(tokenizer, "chat_template", None)
        generator = VLLMGenerator(args.model, tokenizer, add_special_tokens=not uses_template, seed=args.seed)
    else:
        model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, model_file=args.model_file)
        uses_template = settings.use_chat_template and getattr(tokenizer, "chat_template", None)
        # A chat template already writes BOS; adding special tokens again would double it.
        generator = TransformersGenerator(model, tokenizer, add_special_tokens=not uses_template)

    results = run_evaluation(
        generator,
        settings,
        tokenizer=tokenizer,
        model_id=os.path.join(args.model, args.model_file) if args.model_file else args.model,
        backend=args.backend,
        cache_dir=None if args.no_cache else Path(args.out) / "cache",
        baseline=baseline,
    )
    paths = write_report(results, Path(args.out))
    print(markdown_table(results))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
