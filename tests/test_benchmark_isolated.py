"""benchmarks.common.isolated: a worker in a fresh process, its record from the last JSON line."""

from __future__ import annotations

from benchmarks.common.isolated import run_worker


def _module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    return name


def test_the_last_json_object_printed_is_the_record(tmp_path):
    name = _module(
        tmp_path,
        "prints_records",
        'import json\nprint("warming up")\nprint(json.dumps({"a": 1}))\nprint("{not json")\nprint(json.dumps({"a": 2}))\nprint("done")\n',
    )
    assert run_worker(name, [], cwd=str(tmp_path)) == {"a": 2}


def test_a_failing_worker_says_why(tmp_path):
    name = _module(tmp_path, "fails", 'raise SystemExit("no such case: resnet9000")\n')
    assert run_worker(name, [], cwd=str(tmp_path)) == {"error_text": "no such case: resnet9000"}


def test_a_worker_past_its_time_is_stopped(tmp_path):
    name = _module(tmp_path, "sleeps", "import time\ntime.sleep(30)\n")
    assert run_worker(name, [], cwd=str(tmp_path), timeout=1) == {"error_text": "timeout after 1s"}


def test_arguments_and_environment_reach_the_worker(tmp_path):
    name = _module(
        tmp_path,
        "echoes",
        'import json, os, sys\nprint(json.dumps({"argv": sys.argv[1:], "mode": os.environ.get("MODE")}))\n',
    )
    record = run_worker(name, ["--worker", "mlp"], env={"MODE": "x", "PATH": ""}, cwd=str(tmp_path))
    assert record == {"argv": ["--worker", "mlp"], "mode": "x"}
