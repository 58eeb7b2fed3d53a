"""labkit.scale.records: the `labkit scale --json` document and each rank's record hold to their schemas, key by
key and type by type, in a real one-rank run; the checker itself catches what departs from them."""
import json

import pandas as pd
import pytest

from helpers import fake_rank  # noqa: E402
from labkit.scale import records, scaling
from labkit.scale.launch import horovodrun_path

needs_horovod = pytest.mark.skipif(horovodrun_path() is None, reason="horovodrun not installed")


def _doc():
    rows = [scaling.summarize([fake_rank(0, 1, [10.0, 12.0], "x")]),
            scaling.summarize([fake_rank(0, 2, [9.0, 9.0], "y"), fake_rank(1, 2, [9.0, 9.0], "y")])]
    return json.loads(json.dumps(scaling.to_json(scaling.efficiency(pd.DataFrame(rows)), model="small_cnn",
                                                 hosts=None, paired=False)))


def test_the_checker_finds_missing_unknown_and_mistyped_keys():
    doc = _doc()
    assert records.problems(doc, records.ScaleDocument) == []
    del doc["runs"][0]["checksums"]
    doc["runs"][1]["np"] = True  # a bool is no int, in JSON as here
    doc["runs"][1]["efficiency"] = "0.9"
    doc["runs"][1]["checksums"] = ["y", 2]
    doc["colour"] = "red"
    doc["steps"] = 2.5
    assert sorted(records.problems(doc, records.ScaleDocument)) == sorted([
        "ScaleDocument.runs[0]: missing 'checksums'", "ScaleDocument.runs[1].np: expected int; got True",
        "ScaleDocument.runs[1].efficiency: expected float; got '0.9'",
        "ScaleDocument.runs[1].checksums[1]: expected str; got 2",
        "ScaleDocument: 'colour' is not in ScaleDocument", "ScaleDocument.steps: expected int; got 2.5"])
    assert records.problems([], records.RankRecord) == ["RankRecord: expected an object; got list"]


def test_the_published_contract_is_in_the_schema():
    """The keys 04 and the README promise: np, images/s and its spread, efficiency, the ranks' checksums."""
    run = records.ScaleRun.__required_keys__
    assert {"np", "images_per_sec", "images_per_sec_std", "efficiency", "checksums"} <= run
    assert records.ScaleDocument.__required_keys__ == {"runs", "all_in_sync"}
    assert "labkit.scale.records" in scaling.to_json.__doc__ and "DESIGN" not in scaling._report.__doc__


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_a_real_run_writes_both_schemas_key_by_key(tmp_path, monkeypatch):
    """labkit scale --np 1 --paired --json F, the ranks' own records caught on the way: nothing missing, nothing
    unnamed, every value of its type."""
    ranks, real = [], scaling.launch

    def launch(*args, **kw):
        ranks.extend(real(*args, **kw))
        return ranks[-1:]

    monkeypatch.setattr(scaling, "launch", launch)
    out = tmp_path / "scale.json"
    assert scaling.cli_main(["--np", "1", "--steps", "2", "--repeats", "2", "--warmup-steps", "1", "--paired",
                             "--batch-size", "16", "--json", str(out), "--quiet", "--timeout", "240"]) == 0
    doc = json.loads(out.read_text())
    assert records.problems(doc, records.ScaleDocument) == []
    assert [r["np"] for r in doc["runs"]] == [1] and len(doc["runs"][0]["checksums"]) == 1
    assert doc["runs"][0]["efficiency"] == 1.0 and "without_exchange" in doc
    assert len(ranks) == 1 and "no_sync" in ranks[0]
    written = {k: v for k, v in ranks[0].items() if k != "wall_s"}  # launch adds wall_s to what the rank wrote
    assert records.problems(written, records.RankRecord) == []
    assert set(records.RankRecord.__required_keys__) <= set(written)
