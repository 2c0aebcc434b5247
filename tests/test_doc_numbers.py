"""Every number the README and the docs quote is a committed result's, or the CLI's current output.

* ``examples/cli_examples.md`` is what ``python -m benchmarks.tools.cli_examples`` renders from the commands it shows;
* the README's accuracy table is what ``benchmarks.tools.accuracy_table`` renders from the current results;
* every other number in the README's prose is matched by a claim below, each with its check and why;
* every result, doc and example path the README, ``benchmarks/README.md`` and the docs cite exists;
* the summary figures ``benchmarks/README.md`` and the docs quote for a current result are that result's;
* the CUDA-context and CLI figures of earlier versions are quoted nowhere as what the code prints.

Figures of dated investigations and of earlier runs (each names its commit and date) are records, not checked here.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from benchmarks.tools import accuracy_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
CLI_EXAMPLES = ROOT / "examples" / "cli_examples.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def read(path: Path | str) -> str:
    return (ROOT / path).read_text()


def result(path: str) -> dict[str, Any]:
    """A committed result (``path`` relative to ``benchmarks/results``)."""
    return json.loads((RESULTS / path).read_text())


def flat(text: str) -> str:
    """Whitespace runs as one space, so that a quote matches across the file's line wraps."""
    return re.sub(r"\s+", " ", text)


def pct(value: float, digits: int = 1, sign: bool = False) -> str:
    """A percentage as the docs write it: ``pct(0.0302)`` is ``'3.0%'``."""
    return f"{value * 100:{'+' if sign else ''}.{digits}f}%"


# ---------------------------------------------------------------------------------------------------------------------
# a. examples/cli_examples.md is the commands' current output
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_examples_are_what_the_commands_print_now():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")  # the BERT example's factory
    if torch.cuda.is_available():
        pytest.skip("rendered without a GPU (CUDA targets from the tables); a visible GPU changes the output")
    named = re.search(r"torch (\S+?), no GPU", CLI_EXAMPLES.read_text())
    assert named, "examples/cli_examples.md no longer names the torch it was rendered with"
    if named.group(1) != torch.__version__:
        pytest.skip(f"rendered with torch {named.group(1)}, this is {torch.__version__}")
    # a fresh process: no state of earlier tests (autocast registrations, caches) reaches the commands
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.tools.cli_examples", "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, (
        "examples/cli_examples.md differs from what its commands print now; rerun "
        "`python -m benchmarks.tools.cli_examples --write`\n" + run.stdout[-6000:] + run.stderr[-3000:]
    )


def test_cli_examples_trim_keeps_whole_blocks():
    from benchmarks.tools import cli_examples

    output = "\n".join(
        [
            "nnmem calc (napkin:params): batch 8, 32-true, adamw, target cuda (A100 40GB)",
            "┏━━┓",
            "┗━━┛",
            "budget 38.00 GiB: A100 40GB's memory less 5%",
            "batch 8 does NOT fit (device total 131.18 GiB); largest batch that fits: 0 (not even 1)",
            "note: one   ",
            "  wrapped",
            "note: two",
        ]
    )
    kinds = [kind for kind, _ in cli_examples.blocks(output)]
    assert kinds == ["title", "breakdown", "budget", "fit", "note", "note"]
    trimmed = cli_examples.trim(output, ("title", "fit"), notes=("one",)).splitlines()
    assert trimmed == [output.splitlines()[0], "...", output.splitlines()[4], "note: one", "  wrapped", "..."]


# ---------------------------------------------------------------------------------------------------------------------
# b. the README's accuracy table is the current results'
# ---------------------------------------------------------------------------------------------------------------------
def test_readme_accuracy_table_is_rendered_from_the_results():
    assert accuracy_table.readme_table(README.read_text()) == accuracy_table.render(), (
        "README.md's accuracy table differs from the results; rerun `python -m benchmarks.tools.accuracy_table --write`"
    )


# ---------------------------------------------------------------------------------------------------------------------
# c. every number in the README's prose
# ---------------------------------------------------------------------------------------------------------------------
def readme_prose(text: str) -> str:
    """The README without code blocks, inline code, the generated table, comments and link targets; one line."""
    text = re.sub(re.escape(accuracy_table.BEGIN) + ".*?" + re.escape(accuracy_table.END), " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)  # a code span may wrap
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return flat(text)


#: A number in prose: digits not glued to a name (``H100``, ``ResNet-50``, ``FSDP2``), with a range, a percent or a
#: factor; or a count spelled out ("one" is left out: it is mostly a pronoun).
NUMBER = re.compile(
    r"(?<![\w.])(?<!\w-)\d+(?:[.,]\d+)*(?:-\d+(?:[.,]\d+)*)?(?:%|x|×)?(?!\w)"
    r"|\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twice|half|dozen)\b",
    re.I,
)
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _rule_of_thumb_medians(match: re.Match) -> None:
    """The rule of thumb's median miss: the range of the accuracy table's "rule of thumb, median" column."""
    rows = [line.split("|")[1:-1] for line in accuracy_table.render().splitlines()[2:]]
    medians = [round(float(cells[7].strip().rstrip("%"))) for cells in rows if cells[7].strip() != "-"]
    assert (int(match.group(1)), int(match.group(2))) == (min(medians), max(medians)), medians


def _keras_major(match: re.Match) -> None:
    """Keras 3: the major version every extra that pulls Keras requires."""
    pins = set(re.findall(r'"keras>=(\d+)[\d.]*"', read("pyproject.toml")))
    assert pins == {match.group(1)}, pins


def _torch_minimum(match: re.Match) -> None:
    """The torch the ``torch`` extra requires."""
    (pin,) = re.findall(r'^torch = \["torch>=([\d.]+)"\]', read("pyproject.toml"), flags=re.M)
    assert pin == match.group(1), pin


def _two_commands(match: re.Match) -> None:
    """The section has that many commands (its bash blocks)."""
    section = README.read_text().split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"```bash\n", section)) == WORDS[match.group(1).lower()]


def _default_margin(match: re.Match) -> None:
    """The Lightning callback's default ``margin`` and the planner's ``DEFAULT_MARGIN``."""
    import inspect

    from nnmem_callbacks.core.plan import DEFAULT_MARGIN

    assert round(DEFAULT_MARGIN * 100) == int(match.group(1)), DEFAULT_MARGIN
    pytest.importorskip("pytorch_lightning")
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    assert inspect.signature(MemoryBudgetCallback.__init__).parameters["margin"].default == DEFAULT_MARGIN


def _exit_status(match: re.Match) -> None:
    """``nnmem``'s exit statuses: done, internal error, usage error, a batch that does not fit."""
    from nnmem_callbacks import cli

    statuses = (cli.EXIT_OK, cli.EXIT_FAILURE, cli.EXIT_USAGE, cli.EXIT_DOES_NOT_FIT)
    assert statuses == tuple(int(match.group(i)) for i in range(1, 5))


def _sampled_steps(match: re.Match) -> None:
    """How many optimizer steps ``SampledStep`` records per epoch (a recorder stand-in counts them)."""
    from nnmem_callbacks.monitoring.step_sampling import SampledStep

    class Recorder:
        window_peaks = (0, 0)

        def start(self):
            pass

        def mark(self):
            pass

        def stop(self):
            pass

    step, recorded = SampledStep(recorder_factory=Recorder), 0
    step.arm(first_epoch=False)
    for _ in range(5):
        step.begin(lambda: 0)
        recorded += step.recording
        step.batch_done()
    assert recorded == WORDS[match.group(1).lower()], recorded


def _rule_of_thumb_formula(match: re.Match) -> None:
    """The benchmarks' rule of thumb (``benchmarks.common.baselines.rule_of_thumb_bytes``) on a small layer."""
    torch = pytest.importorskip("torch")
    from benchmarks.common.baselines import rule_of_thumb_bytes

    word, params_factor, activation_factor = (int(match.group(i)) for i in (1, 2, 3))
    layer = torch.nn.Linear(10, 10)  # 110 parameters
    assert rule_of_thumb_bytes(layer, 4, 10.0) == word * (params_factor * 110 + activation_factor * 10.0 * 4)


def _compiled_versus_eager(match: re.Match) -> None:
    """How much less (GPT-2) and more (bf16 BatchNorm CNN) the compiled step needs than the eager one, from the
    compile suite's truth and its eager figure: eager = compiled * (1 + eager_error)."""
    rows = {row["case"]: row for row in result("compile/zen4-avx512.json")["rows"]}
    less = 1 - 1 / (1 + rows["gpt2"]["eager_error"])
    more = 1 / (1 + rows["bn_cnn_sgd_bf16"]["eager_error"]) - 1
    assert (int(match.group(1)), int(match.group(2))) == (round(100 * less), round(100 * more)), (less, more)


def _a_name(match: re.Match) -> None:
    """A name, not a figure: QLoRA's quantization is 4-bit by definition."""


def _largest_batch_share(match: re.Match) -> None:
    """``largest_batch/h200.json``: the allocator's share of the cap at nnmem's batch, on the models where 1.10x
    that batch still trained (the loose ones), and how many of all they are."""
    rows = result("largest_batch/h200.json")["rows"]
    loose = [row for row in rows if not row["run_above"]["oom"]]
    shares = [round(row["run"]["reserved_share_of_cap"] * 100) for row in loose]
    assert (int(match.group(1)), int(match.group(2))) == (min(shares), max(shares)), shares
    assert (WORDS[match.group(3).lower()], WORDS[match.group(4).lower()]) == (len(loose), len(rows))


def _step_check_cap(match: re.Match) -> None:
    """The Keras/TensorFlow step check's memory cap: the fixed cap, and its share of the available memory."""
    from nnmem_callbacks.estimators.keras.tensorflow import step_check

    assert step_check.DEFAULT_MEMORY_CAP == int(match.group(1)) << 30
    assert step_check.AVAILABLE_MEMORY_SHARE == 0.25


def _fit_pipeline_batches(match: re.Match) -> None:
    """The batches fit's input pipeline holds beyond the step's, as the TensorFlow estimate counts them."""
    from nnmem_callbacks.estimators.keras.tensorflow.fit_pipeline import INPUT_PIPELINE_BATCHES

    assert INPUT_PIPELINE_BATCHES == WORDS[match.group(1)]


def _onednn_chunk(match: re.Match) -> None:
    """With oneDNN on, the counted allocations' floor, and the judged set's GRU that is off by a chunk."""
    from nnmem_callbacks.allocators.tensorflow_cpu import TF_CPU_COUNTED_MIN_BYTES

    assert TF_CPU_COUNTED_MIN_BYTES == int(match.group(1)) * 1024
    rows = {r["case"]: r for r in result("keras_tensorflow_cpu/zen4-avx512_judged_onednn1.json")["rows"]}
    gru = rows["judged_gru_stack"]
    assert gru["description"].count("GRU(") == WORDS[match.group(2)]
    assert f"{gru['measured_bytes'] / 2**20:.1f}" == match.group(3)
    assert f"{(gru['predicted_bytes'] - gru['measured_bytes']) / 2**20:.1f}" == "-" + match.group(4)


@dataclasses.dataclass(frozen=True)
class Claim:
    pattern: str
    check: Callable[[re.Match], None]


def _unseen_mode(match: re.Match) -> None:
    """The third judged set's TCN (oneDNN on, after the Lambda fix): its fit runs, the check's runs and the bound."""
    row = result("keras_tensorflow_cpu/emr-avx512_judged3-tcn-after-fix_onednn1.json")["rows"][0]
    mib = [f"{b / 2**20:.1f}" for b in (min(row["measured_runs"]), max(row["measured_runs"]))]
    assert mib == [match.group(2), match.group(3)]
    assert len(row["step_check_runs"]) == WORDS[match.group(1)] == WORDS[match.group(4)]
    assert {f"{b / 2**20:.1f}" for b in row["step_check_runs"]} == {match.group(5)}
    assert f"{row['predicted_upper_bytes'] / 2**20:.1f}" == match.group(6)
    assert row["predicted_upper_bytes"] < max(row["measured_runs"])


#: Every number of the README's prose, with the check that backs it (the reason is each check's docstring).
CLAIMS = (
    Claim(r"\((\d+)% less on a GPT-2, (\d+)% more on a bf16 BatchNorm CNN\)", _compiled_versus_eager),
    Claim(r"off by (\d+)-(\d+)% at the median on the runs below", _rule_of_thumb_medians),
    Claim(r"Keras (\d+) \(TensorFlow", _keras_major),
    Claim(r"torch (\d+\.\d+) or newer is required", _torch_minimum),
    Claim(r"The (two) commands", _two_commands),
    Claim(r"\(default (\d+)%\) is kept free", _default_margin),
    Claim(r"Exit status: (\d+) done, (\d+) internal error, (\d+) usage error, (\d+) when or was given", _exit_status),
    Claim(r"the first (two) steps of each epoch run under the profiler", _sampled_steps),
    Claim(
        r'"rule of thumb" is (\d+) bytes x \((\d+) x parameters \+ (\d+) x activations x batch\)',
        _rule_of_thumb_formula,
    ),
    Claim(r"QLoRA \(bitsandbytes 4-bit\)", _a_name),
    Claim(r"it used (\d+)-(\d+)% of a capped allocator on (\w+) of (\w+) models", _largest_batch_share),
    Claim(r"\(up to (\d+) GiB, at most a quarter of the free memory", _step_check_cap),
    Claim(r"with the (two) batches\s*'s input pipeline holds ready", _fit_pipeline_batches),
    Claim(
        r"allocations of (\d+) KiB and more, in whole chunks: a model of a few MiB can be off by a chunk either way "
        r"\(a (two)-layer GRU of (\d+\.\d) MiB: -(\d+\.\d) MiB in the judged set on an AVX-512 host\)",
        _onednn_chunk,
    ),
    Claim(
        r"but not a mode its (three) runs missed \(the judged set's TCN with oneDNN on: runs of (\d+\.\d)-(\d+\.\d) "
        r"MiB, the check's (three) at (\d+\.\d) MiB, the bound (\d+\.\d) MiB\)",
        _unseen_mode,
    ),
)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda claim: claim.check.__name__.strip("_"))
def test_readme_claim_holds(claim):
    matches = list(re.finditer(claim.pattern, readme_prose(README.read_text())))
    assert matches, f"README.md no longer says {claim.pattern!r}: drop or update the claim"
    for match in matches:
        claim.check(match)


def test_every_number_in_readme_prose_is_checked():
    prose = readme_prose(README.read_text())
    covered = [match.span() for claim in CLAIMS for match in re.finditer(claim.pattern, prose)]
    unchecked = [
        f"{number.group(0)!r} in ...{prose[max(number.start() - 50, 0) : number.end() + 30]}..."
        for number in NUMBER.finditer(prose)
        if not any(start <= number.start() and number.end() <= end for start, end in covered)
    ]
    assert not unchecked, "numbers in README.md's prose that no claim of tests/test_doc_numbers.py checks:\n" + (
        "\n".join(unchecked)
    )


def test_readme_torch_pin_is_the_constraints_file():
    """The README's ``torch==...`` pin (inline code) is the one ``.ci/constraints.txt`` installs."""
    pins = re.findall(r"`torch==([\w.+]+)`", README.read_text())
    assert pins, "README.md no longer names the pinned torch"
    constraints = read(".ci/constraints.txt").split()
    assert all(f"torch=={pin}" in constraints for pin in pins), (pins, constraints)


def test_prose_scan_sees_numbers_and_skips_names():
    text = "off by 2-10x on ResNet-50, H100 and FSDP2; `-b 64` in code; 76-87% on three of four; -15.0%"
    found = [match.group(0) for match in NUMBER.finditer(readme_prose(text))]
    assert found == ["2-10x", "76-87%", "three", "four", "15.0%"]


# ---------------------------------------------------------------------------------------------------------------------
# d. every cited path exists
# ---------------------------------------------------------------------------------------------------------------------
CITING = [README, ROOT / "benchmarks" / "README.md", CLI_EXAMPLES, *DOCS]
PATH = re.compile(r"(?<![\w/.-])((?:benchmarks/results|docs|examples)/[\w./{},*-]*[\w}*])")

#: Paths quoted as they were when a dated run was made (records, not links): the text says they are gone.
_SECTION_11 = "section 11, paths then and now: the name at 32b57ee"
_MERGED = "the merge command as run; merged sets leave the tree (benchmarks/README.md)"
HISTORICAL = {
    # (document, path as quoted): why it is not there
    ("docs/keras-jax-xla.md", "benchmarks/results/keras_jax_gpu_h100_prealloc.md"): "the name at 32b57ee, moved",
    (
        "docs/keras-tensorflow-cpu.md",
        "benchmarks/results/keras_tensorflow_cpu_avx512_v4_p{1,2,3,4}_onednn1.json",
    ): _MERGED,
    ("docs/keras-tensorflow-cpu.md", "benchmarks/results/keras_tensorflow_cpu_avx512_v4_p123_onednn0"): _MERGED,
    (
        "docs/keras-tensorflow-cpu.md",
        "benchmarks/results/keras_tensorflow_cpu_avx2_all_onednn0.json",
    ): "left in 41fef1d",
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/keras_tensorflow_cpu_avx2_all_onednn0.json"): "git only",
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/keras_tensorflow_cpu_onednn{0,1}.md"): _SECTION_11,
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/keras_tensorflow_cpu_onednn0.md"): _SECTION_11,
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/keras_tensorflow_cpu_avx512_onednn0.md"): _SECTION_11,
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/tf_memory_events_mobilenetv3small_avx512_onednn0.txt"): (
        _SECTION_11
    ),
    ("docs/keras-tensorflow-replay.md", "benchmarks/results/tf_allocator_fidelity_cpu_avx512.md"): _SECTION_11,
}


def expand(path: str) -> list[str]:
    """Brace alternatives, as the docs write them: ``a.{json,md}`` is ``a.json`` and ``a.md``.

    >>> expand("x/a_{0,1}.{json,md}")
    ['x/a_0.json', 'x/a_0.md', 'x/a_1.json', 'x/a_1.md']
    """
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [q for alt in match.group(1).split(",") for q in expand(path[: match.start()] + alt + path[match.end() :])]


def exists(path: str) -> bool:
    """A file or folder; a glob with a match; or an output stem (``--out results/x/host``) with ``host.*``."""
    if "*" in path:
        return bool(glob.glob(str(ROOT / path)))
    return (ROOT / path).exists() or (not Path(path).suffix and bool(glob.glob(str(ROOT / path) + ".*")))


def cited_paths(document: Path) -> list[str]:
    text = document.read_text().replace("../", "")  # examples/cli_examples.md links from examples/
    return sorted({match.group(1) for match in PATH.finditer(text)})


@pytest.mark.parametrize("document", CITING, ids=lambda path: str(path.relative_to(ROOT)))
def test_cited_paths_exist(document):
    name = document.relative_to(ROOT).as_posix()
    missing = [
        path
        for path in cited_paths(document)
        if (name, path) not in HISTORICAL and not all(exists(each) for each in expand(path))
    ]
    assert not missing, f"{name} cites paths that are not in the repository: {missing}"


@pytest.mark.parametrize("document", [README, CLI_EXAMPLES, *DOCS], ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(document):
    links = re.findall(r"\]\(([^)\s]+)\)", document.read_text())
    targets = [link.split("#", 1)[0] for link in links if not re.match(r"[a-z]+:|#", link)]
    broken = [target for target in targets if not (document.parent / target).exists()]
    assert not broken, f"{document.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_historical_paths_are_quoted_and_gone():
    for (name, path), reason in HISTORICAL.items():
        assert path in read(name), f"{name} no longer quotes {path}: drop it from HISTORICAL"
        assert not any(exists(each) for each in expand(path)), f"{path} exists ({reason}): drop it from HISTORICAL"


# ---------------------------------------------------------------------------------------------------------------------
# e. summary figures quoted for a current result
# ---------------------------------------------------------------------------------------------------------------------
def _torch_run(doc: dict[str, Any]) -> str:
    static, dynamic = doc["summary"]["ours"]["static_shapes"], doc["summary"]["ours"]["data_dependent"]
    return (
        f"{static['n']} static-shape runs median {static['median_abs_error_pct']:.1f}%, worst "
        f"{static['worst_abs_error_pct']:.1f}%, data-dependent {dynamic['median_abs_error_pct']:.1f}% / "
        f"{dynamic['worst_abs_error_pct']:.1f}%"
    )


def _worst_case(doc: dict[str, Any]) -> str:
    return max(doc["rows"], key=lambda row: abs(row["error"]) if row.get("error") is not None else -1)["case"]


def _median_worst(part: dict[str, Any], digits: int = 1) -> str:
    return f"{pct(part['median_abs'], digits)} / {pct(part['worst_abs'], digits)}"


def _bound(summary: dict[str, Any]) -> str:
    covered = summary["upper_bound_covers_every_run"]
    return f"{covered['covered']} of {covered['n']}"


def _keras_row(doc: dict[str, Any], *, zoo_split: str) -> str:
    """A row of the docs' per-run tables: all, replay alone, zoo and outside, the bound, its margin, the rule."""
    s = doc["summary"]
    margin = s["upper_bound_covers_every_run"]
    zoo = _median_worst(s["ours_zoo"]) + zoo_split + _median_worst(s["ours_outside_zoo"])
    return (
        f"| {s['ours']['n']} | {_median_worst(s['ours'])} ({_worst_case(doc)}) | {_median_worst(s['replay_alone'])} "
        f"| {zoo} | {_bound(s)} | {pct(margin['median_margin_over_largest_run'], sign=True)} / "
        f"{pct(margin['largest_margin_over_largest_run'], sign=True)} | {_median_worst(s['rule_of_thumb'])} |"
    )


def _tf_zen4_zen3(docs: dict[str, dict[str, Any]]) -> str:
    off, on = (
        docs["keras_tensorflow_cpu/zen4-avx512_onednn0.json"],
        docs["keras_tensorflow_cpu/zen4-avx512_onednn1.json"],
    )
    off3, on3 = docs["keras_tensorflow_cpu/zen3-avx2_onednn0.json"], docs["keras_tensorflow_cpu/zen3-avx2_onednn1.json"]
    bounds = {_bound(doc["summary"]) for doc in (off, on)}
    assert len(bounds) == 1, bounds  # "in both"
    return (
        f"zen4-avx512: oneDNN off {_median_worst(off['summary']['ours'])}, on {_median_worst(on['summary']['ours'])}, "
        f"bound {bounds.pop()} in both; zen3-avx2: off {_median_worst(off3['summary']['ours'])} "
        f"({off3['summary']['ours']['n']} models), on {_median_worst(on3['summary']['ours'])}"
    )


def _jax_offline(doc: dict[str, Any]) -> str:
    allocator = [abs(row["error_allocator"]) for row in doc["rows"]]
    buffers = [abs(row["error_buffers"]) for row in doc["rows"]]
    return (
        f"growth mode median {pct(statistics.median(allocator))}, worst {pct(max(allocator))} "
        f"(XLA's buffers alone {pct(statistics.median(buffers))} / {pct(max(buffers))})"
    )


def _tf_fidelity(doc: dict[str, Any]) -> str:
    errors = [abs(row["replay_start_bytes"] - row["real_bytes"]) / row["real_bytes"] for row in doc["rows"]]
    return f"as the replay starts, median {pct(statistics.median(errors), 2)}, worst {pct(max(errors))} over {len(errors)} models"


def _distributed(doc: dict[str, Any]) -> str:
    errors = [row["error_pct"] for row in doc["rows"]]
    worst = max(errors, key=abs)
    return f"median {statistics.median(map(abs, errors)):.2f}%, worst {worst:+.1f}% over {len(errors)} rank runs"


def _offline_cuda(doc: dict[str, Any]) -> str:
    zoo = doc["zoo_summary"]
    return f"({zoo['within_0.5pct']} of {zoo['traced_on_device']} within 0.5%)"


def _speed(host: str) -> Callable[[dict[str, Any]], str]:
    def render(doc: dict[str, Any]) -> str:
        resnet, gpt2 = (row["ratio"] for row in doc["memtracker"])
        share = doc["probe_memory"]["probe_share_bytes"] / 2**20
        return (
            f"On {host}: {resnet:.1f}× (ResNet-50) and {gpt2:.1f}× (GPT-2 small) the speed of MemTracker; the "
            f"probes' share of the memory rise {share:.0f} MiB."
        )

    return render


def _tf_current_both(docs: dict[str, dict[str, Any]]) -> str:
    off, on = (
        docs["keras_tensorflow_cpu/zen4-avx512_onednn0.json"],
        docs["keras_tensorflow_cpu/zen4-avx512_onednn1.json"],
    )
    bounds = {_bound(doc["summary"]) for doc in (off, on)}
    assert len(bounds) == 1, bounds
    return (
        f"oneDNN off (80e5ac2, same predictions) median {pct(off['summary']['ours']['median_abs'])}, worst "
        f"{pct(off['summary']['ours']['worst_abs'])}; oneDNN on (a74fab9) median {pct(on['summary']['ours']['median_abs'])}, "
        f"worst {pct(on['summary']['ours']['worst_abs'])}; the upper bound above every run for {bounds.pop()} in both"
    )


def _tf_zen4_off_bold(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    return (
        f"**median {pct(s['ours']['median_abs'])}, worst {pct(s['ours']['worst_abs'])} ({_worst_case(doc)}), replay "
        f"alone {_median_worst(s['replay_alone'])}, outside the zoo {_median_worst(s['ours_outside_zoo'])}, the upper "
        f"bound above every run for {_bound(s)}.**"
    )


def _zen5_row(doc: dict[str, Any]) -> str:
    """A row of the Zen 5 run's table: with the models first measured blind, without the model count."""
    s = doc["summary"]
    margin = s["upper_bound_covers_every_run"]
    blind = "; ".join(_median_worst(s[f"ours_first_measured_2026_11_{day}"]) for day in ("24", "25", "25_later"))
    return (
        f"| {_median_worst(s['ours'])} ({_worst_case(doc)}) | {_median_worst(s['replay_alone'])} "
        f"| {_median_worst(s['ours_zoo'])} | {_median_worst(s['ours_outside_zoo'])} | {blind} | {_bound(s)} "
        f"| {pct(margin['median_margin_over_largest_run'], sign=True)} / "
        f"{pct(margin['largest_margin_over_largest_run'], sign=True)} | {_median_worst(s['rule_of_thumb'])} |"
    )


def _capped(doc: dict[str, Any], models: str) -> str:
    """The capped run's sentence: median, worst, the replay alone, the bound and its margin, the rule of thumb."""
    s = doc["summary"]
    return (
        f"median {pct(s['ours']['median_abs'])}, worst {pct(s['ours']['worst_abs'])} ({_worst_runs(doc)}), replay "
        f"alone {_median_worst(s['replay_alone'])}, the upper bound above every run for {_bound(s)}{models} at "
        f"{pct(s['upper_bound_covers_every_run']['median_margin_over_largest_run'], sign=True)} over the largest run "
        f"at the median, the rule of thumb {_median_worst(s['rule_of_thumb'])}"
    )


#: How the capped runs' sentences name their worst model.
_CAPPED_WORST = {"gru_text": "the GRU text model again: real runs", "mobilenetv3small": "MobileNetV3-Small, runs"}


def _worst_runs(doc: dict[str, Any]) -> str:
    """The worst model, as the sentence names it, and the range of its real runs."""
    case = _worst_case(doc)
    runs = next(row["measured_runs"] for row in doc["rows"] if row["case"] == case)
    return f"{_CAPPED_WORST[case]} {min(runs) / 2**20:.1f}-{max(runs) / 2**20:.1f} MiB"


def _jax_prealloc(doc: dict[str, Any]) -> str:
    return (
        f"on an H100, {doc['summary']['ours']['n']} Keras models within {pct(doc['summary']['ours']['worst_abs'], 2)}"
    )


def _commit_of(doc: dict[str, Any]) -> str:
    return doc["meta"].get("commit", "") + doc["meta"].get("merged_from", "")


@dataclasses.dataclass(frozen=True)
class Quote:
    """A figure a document quotes for a current result: the text ``render`` makes from the result must be there."""

    document: str
    results: tuple[str, ...]
    render: Callable[..., str]

    def text(self) -> str:
        docs = {path: result(path) for path in self.results}
        return self.render(docs) if len(docs) > 1 else self.render(docs[self.results[0]])


TF = ("keras_tensorflow_cpu/zen4-avx512_onednn0.json", "keras_tensorflow_cpu/zen4-avx512_onednn1.json")
QUOTES = (
    Quote(
        "benchmarks/README.md",
        ("accuracy/zen4-avx512.json",),
        lambda doc: "the current zen4-avx512 run: " + _torch_run(doc),
    ),
    Quote(
        "benchmarks/README.md",
        (*TF, "keras_tensorflow_cpu/zen3-avx2_onednn0.json", "keras_tensorflow_cpu/zen3-avx2_onednn1.json"),
        _tf_zen4_zen3,
    ),
    Quote(
        "benchmarks/README.md",
        ("keras_tensorflow_cpu/zen3-avx2_developed_onednn0.json",),
        lambda doc: (
            "the developed models under `fit`'s truth (issue #46), zen3-avx2, oneDNN off: "
            f"{_median_worst(doc['summary']['ours'])} ({_worst_case(doc)}; {doc['summary']['ours']['n']} models), "
            f"bound {_bound(doc['summary'])}"
        ),
    ),
    Quote(
        "benchmarks/README.md",
        ("keras_tensorflow_cpu/zen3-avx2_developed_onednn1.json",),
        lambda doc: (
            "with oneDNN on: "
            f"{_median_worst(doc['summary']['ours'])} ({_worst_case(doc)}; {doc['summary']['ours']['n']} models), "
            f"bound {_bound(doc['summary'])}"
        ),
    ),
    Quote("benchmarks/README.md", ("jax_allocator_offline/h100_growth.json",), _jax_offline),
    Quote("benchmarks/README.md", ("tf_allocator_fidelity/avx512.json",), _tf_fidelity),
    Quote("benchmarks/README.md", ("distributed/zen4-avx512.json",), _distributed),
    Quote("benchmarks/README.md", ("offline_cuda/h100.json",), _offline_cuda),
    Quote("benchmarks/README.md", ("speed/zen4-avx512.json",), _speed("zen4-avx512")),
    Quote("benchmarks/README.md", ("speed/zen3-avx2.json",), _speed("zen3-avx2")),
    Quote("docs/keras-tensorflow-cpu.md", TF, _tf_current_both),
    Quote("docs/keras-tensorflow-cpu.md", (TF[0],), _tf_zen4_off_bold),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        (TF[1],),
        lambda doc: "| 1 (oneDNN on, this host's default), a74fab9 " + _keras_row(doc, zoo_split="; "),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen3-avx2_onednn0.json",),
        lambda doc: "| 0 " + _keras_row(doc, zoo_split=" | "),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen3-avx2_onednn1.json",),
        lambda doc: "| 1 " + _keras_row(doc, zoo_split=" | "),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen5-avx512_onednn1.json",),
        lambda doc: "| 1 (oneDNN on, this host's default) " + _zen5_row(doc),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen5-avx512_onednn0.json",),
        lambda doc: "| 0 (oneDNN off, the default without AVX-512) " + _zen5_row(doc),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen5-avx512-capped-avx2_onednn1.json",),
        lambda doc: _capped(doc, " models"),
    ),
    Quote(
        "docs/keras-tensorflow-cpu.md",
        ("keras_tensorflow_cpu/zen5-avx512-capped-avx2_onednn0.json",),
        lambda doc: _capped(doc, ""),
    ),
    Quote("docs/keras-jax-xla.md", ("keras_jax_gpu/h100_prealloc.json",), _jax_prealloc),
)


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.document}:{q.results[0]}")
def test_quoted_summary_is_the_results(quote):
    expected = flat(quote.text())
    assert expected in flat(read(quote.document)), (
        f"{quote.document} should quote, from {', '.join(quote.results)}:\n  {expected}"
    )


def test_quoted_commits_are_the_results():
    """The commits the docs name for the current Keras/TensorFlow results are the ones the results record."""
    assert "80e5ac2" in _commit_of(result(TF[0])) and "a74fab9" in _commit_of(result(TF[1]))


# ---------------------------------------------------------------------------------------------------------------------
# the figures of earlier versions, quoted as what the code prints
# ---------------------------------------------------------------------------------------------------------------------
#: The CUDA context the CLI assumed before the measured tables (512 MiB + 32 MiB cuBLAS), and the CLI's figures of
#: that time for BERT on an A100 40GB (5.05 / 5.72 GiB, largest batch 314) and ResNet-50 16-mixed (3.03 / 3.92 GiB).
STALE = (
    r"\b544 MiB",
    r"\b512 MiB[^.]{0,80}context|context[^.]{0,80}\b512 MiB",
    r"(?<![\d.])5\.05 GiB",
    r"(?<![\d.])5\.72 GiB",
    r"(?<![\d.])3\.03 GiB",
    r"(?<![\d.])3\.92 GiB",
    r"largest batch (?:that fits:? )?(?:302|314)\b",
)


def _prose_of_cli_examples() -> str:
    """examples/cli_examples.md without its output blocks (those are the commands' output, checked above)."""
    return re.sub(r"```text\n.*?```", " ", CLI_EXAMPLES.read_text(), flags=re.S)


@pytest.mark.parametrize("document", [README, CLI_EXAMPLES, *DOCS], ids=lambda path: str(path.relative_to(ROOT)))
def test_no_stale_cli_figures(document):
    text = flat(_prose_of_cli_examples() if document == CLI_EXAMPLES else document.read_text())
    found = [match.group(0) for pattern in STALE for match in re.finditer(pattern, text)]
    assert not found, f"{document.relative_to(ROOT)} quotes figures of an earlier nnmem: {found}"
