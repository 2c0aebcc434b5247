"""benchmarks.tools.repredict without running estimates: the kinds, the host check, the verdict and the retries."""

from __future__ import annotations

import json

import pytest

from benchmarks.tools import repredict


def _tf_result(tmp_path, isa: str):
    rows = [
        {"case": "mlp", "backend": "tensorflow", "predicted_bytes": 100, "predicted_upper_bytes": 150},
        {"case": "lstm", "backend": "tensorflow", "predicted_bytes": 200, "predicted_upper_bytes": 250},
        {"case": "gone", "backend": "tensorflow", "error_text": "it failed then"},
    ]
    meta = {"cpu": "CPU", "isa": isa, "TF_ENABLE_ONEDNN_OPTS": "0"}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


@pytest.fixture
def this_host(monkeypatch):
    import benchmarks.common.keras_env as keras_env

    monkeypatch.setattr(keras_env, "host_fingerprint", lambda: {"cpu": "CPU", "isa": "avx2", "cpu_threads": 2})


def test_every_case_the_committed_bytes_exits_0_and_one_byte_off_exits_1(tmp_path, monkeypatch, this_host, capsys):
    path = _tf_result(tmp_path, "avx2")
    now = {"mlp": (100, 150), "lstm": (200, 250)}
    monkeypatch.setattr(
        repredict,
        "_tensorflow_case",
        lambda row, onednn, timeout: repredict.compare_tensorflow(
            row, {"predicted_bytes": now[row["case"]][0], "predicted_upper_bytes": now[row["case"]][1]}
        ),
    )
    assert repredict.main([str(path)]) == 0
    assert "2 of 2 cases predict the committed bytes" in capsys.readouterr().out  # the failed row is not compared
    now["lstm"] = (200, 251)
    assert repredict.main([str(path)]) == 1
    assert "| lstm | 200 | 200 | 0 | 250 | 251 | NO |" in capsys.readouterr().out


def test_a_retry_that_gives_the_committed_bytes_matches_and_says_so(tmp_path, monkeypatch, this_host, capsys):
    path = _tf_result(tmp_path, "avx2")
    tries = {"mlp": [(100, 150)], "lstm": [(456, 250), (200, 250)]}

    def estimate(row, onednn, timeout):
        bytes_, upper = tries[row["case"]].pop(0) if len(tries[row["case"]]) > 1 else tries[row["case"]][0]
        return repredict.compare_tensorflow(row, {"predicted_bytes": bytes_, "predicted_upper_bytes": upper})

    monkeypatch.setattr(repredict, "_tensorflow_case", estimate)
    assert repredict.main([str(path), "--retries", "1"]) == 0
    assert "yes (try 2; the first gave 456)" in capsys.readouterr().out
    tries["lstm"] = [(456, 250), (457, 250)]
    assert repredict.main([str(path), "--retries", "1"]) == 1  # a change moves every try


def test_a_result_of_another_host_is_refused_unless_asked(tmp_path, monkeypatch, this_host, capsys):
    path = _tf_result(tmp_path, "avx2,avx512f")
    monkeypatch.setattr(
        repredict, "_tensorflow_case", lambda row, onednn, timeout: repredict.compare_tensorflow(row, row)
    )
    assert repredict.main([str(path)]) == 2
    assert "another kind of host (isa" in capsys.readouterr().err
    assert repredict.main([str(path), "--any-host"]) == 0
    assert "another host" in capsys.readouterr().out


def test_results_it_cannot_re_predict_are_refused(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps({"meta": {"device": "cuda"}, "rows": [{"case": "mlp", "optimizer": "adam", "precision": "32-true"}]})
    )
    with pytest.raises(SystemExit):
        repredict.main([str(path)])
