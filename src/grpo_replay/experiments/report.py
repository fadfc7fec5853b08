"""Aggregating finished runs into tables (markdown), machine-readable results (JSON/CSV) and PNG plots."""
from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from ..plotting import comparison as plots
from ..app.provenance import UNRECORDED, describe, provenance, run_commits_line, run_cpu_kinds_line
from .arms import BASE, COMPARISONS, Arm, Setting, comparison_arms
from .final_eval import BenchSettings
from . import alternatives, contrasts, paired_view
from .markdown import count as _k, table as _table
from .claims import check_claims
from .jobs import RunSpec
from .run_hash import UNHASHED
from .stats import CONFIDENCE, POWER, ArmStats, Run, arm_stats, choose_budgets, curve_grid, format_ci, format_diff, load_run


def build_report(
    specs: list[RunSpec],
    arms: dict[str, Arm],
    setting: Setting,
    comparisons: list[str],
    report_dir: Path,
    command: str,
    extra_overrides: Optional[dict] = None,
    run_info: Optional[dict] = None,
    bench: Optional["BenchSettings"] = None,
) -> dict[str, Any]:
    """Write report.md, results.json, results.csv, runs.csv and the PNGs into report_dir; return the results.

    With `bench` (a real-model comparison), the paper's table from the benchmark stage comes first
    (paper_table.csv too) and the claims are judged on the benchmarks' mean accuracy instead of the held-out set."""
    report_dir.mkdir(parents=True, exist_ok=True)
    runs, missing = _load_runs(specs)
    # † marks arms that generate more rollouts per step than the rest (not at the same generation budget).
    labels = {a.name: a.label + ("" if a.same_budget else " †") for a in arms.values()}
    results = _header(specs, runs, missing, arms, labels, setting, command, extra_overrides, run_info)
    if not runs.get(BASE):
        (report_dir / "report.md").write_text(f"# grpo-replay compare\n\nNo finished {BASE} runs yet; missing: {missing}\n")
        (report_dir / "results.json").write_text(json.dumps(results, indent=1))
        return results

    base_by_seed = {r.seed: r for r in runs[BASE]}
    budgets = choose_budgets(runs[BASE], setting.budgets)
    n_max = max(int(r.final["n_samples"]) for rs in runs.values() for r in rs)
    grid = curve_grid([r for rs in runs.values() for r in rs])
    stats = {a: arm_stats(rs, base_by_seed, budgets, list(range(1, n_max + 1)), grid) for a, rs in runs.items()}
    claims = check_claims(runs)
    table_md = ""
    if bench is not None:
        claims, table_md = _benchmark_table(results, specs, runs, labels, bench, report_dir)
    results["budgets"] = budgets
    results["claims"] = claims
    results["arm_stats"] = {a: _jsonable(st.__dict__) for a, st in stats.items()}
    results["paired_view"] = paired_view.views_for(specs, runs, base_by_seed, grid)
    files = _figures(results, specs, runs, stats, arms, labels, setting, comparisons, report_dir)
    results["files"] = [f.name for f in files] + ["report.md", "results.json", "results.csv", "runs.csv"] + (["paper_table.csv"] if bench else [])

    _write_csv(report_dir / "results.csv", stats, budgets)
    _write_runs_csv(report_dir / "runs.csv", runs)
    (report_dir / "results.json").write_text(json.dumps(_jsonable(results), indent=1))
    (report_dir / "report.md").write_text(_markdown(results, stats, runs, labels, comparisons, budgets, files, table_md))
    return results


def _load_runs(specs: list[RunSpec]) -> tuple[dict[str, list[Run]], list[str]]:
    """The finished runs by arm (in plan order), and "arm/seedN" of each planned run that has not finished."""
    runs: dict[str, list[Run]] = {}
    missing = []
    for s in specs:
        r = load_run(s.arm, s.seed, s.run_dir)
        if r is None:
            missing.append(f"{s.arm}/seed{s.seed}")
        else:
            runs.setdefault(s.arm, []).append(r)
    return runs, missing


def shared_settings(specs: list[RunSpec]) -> dict[str, Any]:
    """The overrides every planned run has with one value (an arm's or a seed's own are not shared), minus the keys
    that change nothing in a run's results (`run_hash.UNHASHED`): what the report can say of every run it reads."""
    if not specs:
        return {}
    first = specs[0].overrides
    return {k: v for k, v in first.items()
            if k not in UNHASHED and all(k in s.overrides and s.overrides[k] == v for s in specs[1:])}


def _header(specs, runs, missing, arms, labels, setting, command, extra_overrides, run_info) -> dict[str, Any]:
    """The results' description of what ran: command, setting, seeds, provenance, arms and warm starts; the
    sections after it are filled in by `build_report`."""
    return {
        "title": _title(setting, extra_overrides),
        "command": command,
        "setting": setting.name,
        "overrides": shared_settings(specs),
        "seeds": sorted({s.seed for s in specs}),
        "confidence": CONFIDENCE,
        "power": POWER,  # of every claim's minimum detectable effect ("mde" beside each paired CI)
        "missing_runs": missing,
        "run_info": run_info or {},
        "provenance": provenance(),
        "run_commits": dict(Counter(r.commit or UNRECORDED for rs in runs.values() for r in rs)),
        "run_cpu_kinds": dict(Counter(r.cpu_kind or UNRECORDED for rs in runs.values() for r in rs)),
        "arms": {n: {"label": labels[n], "overrides": arms[n].overrides, "seeds": [r.seed for r in runs.get(n, [])]} for n in runs},
        # One warm start per seed, shared by every arm (the size series reads each size's from here).
        "warm_starts": {str(r.seed): r.warm_start for r in sorted(runs.get(BASE, []), key=lambda r: r.seed)},
        "comparisons": {},
        "claims": [],
        "files": [],
    }


def _benchmark_table(results, specs, runs, labels, bench: BenchSettings, report_dir: Path) -> tuple[list[dict], str]:
    """The benchmark stage's part: the paper's table (results["paper_table"], paper_table.csv) and the claims
    judged on the benchmarks. Returns (claims, the table's markdown)."""
    from . import paper_table

    bruns, bmissing = paper_table.load_bench_runs(specs, bench)
    tstats = paper_table.table_stats(bruns, bench.labels(), list(bench.ks))
    results["bench_settings"] = bench.to_dict()
    results["paper_table"] = {"missing_runs": bmissing, "arms": _jsonable(tstats)}
    paper_table.write_csv(report_dir / "paper_table.csv", tstats)
    return check_claims(paper_table.claim_runs(bruns)), paper_table.markdown(tstats, list(runs), labels, bench, bmissing)


def _figures(results, specs, runs, stats, arms, labels, setting: Setting, comparisons, report_dir: Path) -> list[Path]:
    """Each comparison's PNGs (accuracy, pass@k, paired differences; the alternatives' three axes) and the tau_max
    curve; records each comparison's arms (and alternatives section) in results["comparisons"]."""
    views = results["paired_view"]
    files = []
    for c in comparisons:
        comp = COMPARISONS[c]
        names = [a for a in comparison_arms(c, setting.only_arms) if a in stats]
        results["comparisons"][c] = {"title": comp.title, "question": comp.question, "arms": names}
        files.append(plots.accuracy_curves(stats, names, labels, comp.title, report_dir / f"accuracy_{c}.png"))
        files.append(plots.pass_at_k_curves(stats, names, labels, comp.title, report_dir / f"pass_at_k_{c}.png"))
        others = [a for a in names if a != BASE]
        if others:
            files.append(plots.paired_diff_curves(views, others, labels, comp.title, report_dir / f"paired_{c}.png"))
        if comp.pairs and not comp.on_axes:  # the pre-registered contrasts (the axes section has its own pairs)
            results["comparisons"][c]["contrasts"] = contrasts.rows(runs, comp.pairs)
        if comp.on_axes:  # the three axes and the reach of the reference arm (PLAN.md, sections G and H)
            dirs = {a: {s.seed: Path(s.run_dir) for s in specs if s.arm == a and any(x.seed == s.seed for x in runs[a])}
                    for a in names}
            sec = alternatives.section(dirs, comp.reference, comp.pairs)
            results["comparisons"][c]["alternatives"] = sec
            files.append(plots.axes_curves(sec, names, labels, comp.title, report_dir / f"axes_{c}.png",
                                           alternatives.AXES, alternatives.ALTERNATIVES))
    tau_arms = {a.name: a.tau for a in arms.values() if a.tau is not None and a.name in stats}
    if "tau_max" in comparisons and tau_arms:
        files.append(plots.tau_curve(stats, tau_arms, report_dir / "tau_max.png"))
    return files


# ------------------------------------------------------------------------------------------- formatting
def _num(c: dict, fmt: str = "{:.0f}") -> str:
    return "n/a" if not c or c.get("mean") is None else fmt.format(c["mean"])


def _more_rollouts(results: dict) -> str:
    """What the † arms are: compute-matched GRPO, and DAPO's dynamic sampling when one of its arms ran."""
    dynamic = any(a["overrides"].get("dynamic_sampling") for a in results.get("arms", {}).values())
    return "compute-matched GRPO" + (", DAPO's dynamic sampling" if dynamic else "")


def _title(setting: Setting, extra: Optional[dict]) -> str:
    model = {**setting.overrides, **(extra or {})}.get("model")
    where = f"{Path(str(model)).name}" if model else "the embedded testbed"
    return f"grpo-replay compare: the paper's comparisons on {where} ({setting.name} setting)"


def _markdown(results, stats: dict[str, ArmStats], runs, labels, comparisons, budgets, files, table_md: str = "") -> str:
    seeds = results["seeds"]
    real = bool(table_md)
    lines = [
        f"# {results['title']}",
        "",
        "Made by:",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"Seeds {seeds} (seed i sets the training seed, the evaluation sampling seed = seed + 777, and the warm start "
        "`testbed.seed` = i; arms are paired by seed). Every number is a mean over seeds with a two-sided "
        f"{int(100 * results['confidence'])} % t-interval in brackets; Δ columns are paired (same-seed) differences vs "
        "GRPO, in percentage points, marked * when the interval excludes 0. Accuracies are held-out accuracy in %: "
        "sampled = mean@n (the paper's metric), greedy = one greedy completion per problem. † = an arm that generates "
        f"more rollouts per step than the others ({_more_rollouts(results)}), so at equal steps it is not at the same "
        "generation budget; the budget tables interpolate it at the same generated-rollout counts.",
        "",
        "Settings shared by every run (other keys: the trainer's and testbed's defaults, see each run's config.yaml): `"
        + " ".join(f"{k}={v}" for k, v in results["overrides"].items())
        + "`",
        "",
    ]
    warm = [(r.seed, r.warm_start) for r in sorted(runs.get(BASE, []), key=lambda r: r.seed)]
    if warm and any(w.get("step") is not None for _, w in warm):
        lines += ["Warm starts (one per seed, shared by all arms): " + "; ".join(
            f"seed {s}: pass@1 {(w.get('pass_rate') if w.get('pass_rate') is not None else float('nan')):.3f} at step {w.get('step')} ({w.get('stop_reason')})"
            for s, w in warm) + ".", ""]
    info = results.get("run_info") or {}
    if info:
        lines += [f"Runs: {info.get('runs', '?')} ({info.get('ran', 0)} run now, {info.get('skipped', 0)} reused), "
                  f"{info.get('jobs', '?')} parallel jobs, wall time of this invocation {info.get('wall_s', 0) / 60:.1f} min.", ""]
    if results.get("provenance"):
        made = run_commits_line(results.get("run_commits") or {}, results["provenance"].get("commit"))
        kinds = run_cpu_kinds_line(results.get("run_cpu_kinds") or {})
        lines += [f"Code: {describe(results['provenance'])}." + (f" {made}" if made else "") + (f" {kinds}" if kinds else ""), ""]
    if results["missing_runs"]:
        lines += [f"**Missing (unfinished or failed) runs, left out of every number:** {', '.join(results['missing_runs'])}", ""]

    if real:
        lines += [table_md, ""]
    lines += ["## The paper's claims on the " + ("benchmarks (mean accuracy over them)" if real else "testbed"), ""]
    lines.append(_table(["claim", "verdict", "evidence"], [[c["claim"], f"**{c['verdict']}**", "<br>".join(c["evidence"]) or "–"] for c in results["claims"]]))
    lines += ["", "Verdicts: *holds* = paired difference in the claimed direction with a 95 % CI excluding 0; "
              "*direction agrees, not significant* = right sign, CI includes 0; *does not hold* = wrong sign or zero (within 1e-9); "
              "*not tested* = an arm is missing in this setting.", "",
              f"MDE = the minimum detectable effect of this setting: the true paired difference a two-sided "
              f"{int(100 * results['confidence'])} % paired t-test over these seeds would detect with "
              f"{int(100 * results.get('power', POWER))} % power, (t_0.975,n-1 + t_0.80,n-1) x sd of the per-seed differences / sqrt(n) "
              "(the held-out evaluation's noise is inside each seed's value); n/a with fewer than 2 seeds. A difference "
              "smaller than the MDE may be real yet undetectable here: *not significant* then says little.", ""]

    if real:
        lines += ["# During training: the held-out split of the training data", "",
                  "The tables below are the trainer's own evaluations on held-out training prompts (`eval_problems`, "
                  "`eval_samples`), at fixed generated-rollout budgets; the table above is the benchmarks.", ""]
    for c in comparisons:
        comp = results["comparisons"].get(c)
        if not comp:
            continue
        lines += _comparison_section(c, comp, stats, labels, budgets, files)
        png = f"paired_{c}.png" if any(Path(f).name == f"paired_{c}.png" for f in files) else None
        lines += paired_view.markdown(comp["arms"], labels, results.get("paired_view") or {}, budgets, png)
        lines += contrasts.markdown(comp.get("contrasts") or [], labels)
        if "alternatives" in comp:
            lines += alternatives.markdown(comp["arms"], labels, comp["alternatives"], f"axes_{c}.png")

    lines += ["## Files", "", "results.json (everything above, machine-readable), results.csv (one row per arm x metric), "
              "runs.csv (one row per run), the PNGs. Run directories: `<out>/runs/<arm>/seed<i>-<config hash>/`.", ""]
    return "\n".join(lines)


def _comparison_section(c: str, comp: dict, stats: dict[str, ArmStats], labels, budgets, files) -> list[str]:
    """The report's section of one comparison: accuracy at budgets, end of training, pass@k, figures."""
    lines: list[str] = []
    names = comp["arms"]
    lines += [f"## {comp['title']}", "", comp["question"], ""]
    for key, name in (("acc_sampled", "sampled mean@n"), ("acc_greedy", "greedy")):
        header = ["arm"] + [f"{name} @ {_k(b)} rollouts" for b in budgets] + [f"Δ vs GRPO @ {_k(budgets[-1])}"]
        rows = []
        for a in names:
            st = stats[a]
            rows.append([labels[a]] + [format_ci(st.budgets[b][key]) for b in budgets] + [format_diff(st.budgets[budgets[-1]][key + "_diff"]) if a != BASE else "–"])
        lines += [f"Held-out accuracy ({name}, %) at fixed generated-rollout budgets:", "", _table(header, rows), ""]
    header = ["arm", "generated", "update rows", "sampled", "Δ sampled", "greedy", "Δ greedy",
              "rollouts to GRPO's final acc. (seeds reaching)", "AES vs GRPO", "len correct (Δ % vs GRPO)", "len incorrect (Δ % vs GRPO)"]
    rows = []
    for a in names:
        st = stats[a]
        f, reach = st.final, st.reach
        mc = reach["mean_curve"]
        rows.append([
            labels[a], _k(f["generated"]["mean"]), _k(f["update_rows"]["mean"]), format_ci(f["acc_sampled"]),
            format_diff(f["acc_sampled_diff"]) if a != BASE else "–", format_ci(f["acc_greedy"]), format_diff(f["acc_greedy_diff"]) if a != BASE else "–",
            f"{_k(mc) if mc is not None else 'not reached'} ({reach['reached']}/{reach['n']})",
            format_diff(f["aes"], scale=1.0) if a != BASE else "–",
            f"{_num(f['len_correct'], '{:.2f}')} ({format_diff(f['len_correct_rel'], unit=' %')})" if a != BASE else _num(f["len_correct"], "{:.2f}"),
            f"{_num(f['len_incorrect'], '{:.2f}')} ({format_diff(f['len_incorrect_rel'], unit=' %')})" if a != BASE else _num(f["len_incorrect"], "{:.2f}"),
        ])
    lines += [
        "At the end of training (equal steps, so equal update rows for the compute-matched GRPO; it generated more). "
        "'Rollouts to GRPO's final acc.' is where the seed-mean sampled-accuracy curve first reaches GRPO's mean final "
        "sampled accuracy (linear between evaluations), with the number of seeds whose own curve reaches it. "
        "AES (alpha 1, beta 3, gamma 5) uses sampled accuracy and mean completion length, paired per seed. "
        "Lengths are mean completion tokens.",
        "", _table(header, rows), "",
    ]
    ks = [k for k in sorted(k for k in stats[BASE].pass_at_k if k != "diff") if k & (k - 1) == 0]
    header = ["arm"] + [f"pass@{k}" for k in ks] + [f"Δ pass@{ks[-1]} vs GRPO"]
    rows = [[labels[a]] + [format_ci(stats[a].pass_at_k.get(k)) for k in ks] + [format_diff(stats[a].pass_at_k["diff"].get(ks[-1])) if a != BASE else "–"] for a in names]
    lines += ["Final held-out pass@k (%, unbiased estimator from the per-problem counts):", "", _table(header, rows), ""]
    lines += [f"![accuracy vs generated rollouts](accuracy_{c}.png)", "", f"![pass@k](pass_at_k_{c}.png)", ""]
    if c == "tau_max" and (Path(files[0]).parent / "tau_max.png").exists():
        lines += ["![tau_max curve](tau_max.png)", ""]
    return lines


# ---------------------------------------------------------------------------------------------- writers
def _write_csv(path: Path, stats: dict[str, ArmStats], budgets: list[float]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "metric", "at", "mean", "ci_lo", "ci_hi", "n", "diff_vs_grpo", "diff_lo", "diff_hi"])

        def row(arm, metric, at, c, d=None):
            d = d or {}
            w.writerow([arm, metric, at, c.get("mean"), c.get("lo"), c.get("hi"), c.get("n"), d.get("mean"), d.get("lo"), d.get("hi")])

        for arm, st in stats.items():
            for b in budgets:
                for key in ("acc_sampled", "acc_greedy"):
                    row(arm, key, f"generated={b:g}", st.budgets[b][key], st.budgets[b][key + "_diff"])
            for key in ("acc_sampled", "acc_greedy", "len_all", "len_correct", "len_incorrect"):
                row(arm, key, "final", st.final[key], st.final[key + "_diff"])
            for key in ("len_correct_rel", "len_incorrect_rel", "len_all_rel", "aes", "generated", "update_rows"):
                row(arm, key, "final", st.final[key])
            for k, c in st.pass_at_k.items():
                if k != "diff":
                    row(arm, f"pass@{k}", "final", c, st.pass_at_k["diff"].get(k))
            row(arm, "rollouts_to_grpo_final_acc", f"target={st.reach['target']:.4f}", st.reach["per_seed"])


def _write_runs_csv(path: Path, runs: dict[str, list[Run]]) -> None:
    keys = ["acc_sampled", "acc_greedy", "len_all", "len_correct", "len_incorrect"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "seed", "generated", "update_rows", *keys, "pass_at_k"])
        for arm, rs in runs.items():
            for r in rs:
                w.writerow([arm, r.seed, r.generated, r.update_rows, *[r.final.get(k) for k in keys], json.dumps(r.final.get("pass@k"))])


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return x.item()
    return x
