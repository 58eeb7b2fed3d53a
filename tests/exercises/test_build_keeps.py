"""`labkit exercises build DIR --force` keeps a copy of every notebook it replaces that it did not write (a learner's
edits), and says where: nothing a learner wrote is lost."""
import pytest

from helpers import ROOT, labkit_cli, sha

SOURCE = ROOT / "notebooks"


@pytest.mark.slow
def test_force_keeps_the_learners_edits_and_says_where(tmp_path):
    learner = tmp_path / "learner"
    done = labkit_cli("exercises", "build", str(learner))
    assert done.returncode == 0, done.stderr
    assert "kept" not in done.stdout  # nothing replaced, nothing to keep
    edited = learner / "02_im2col.ipynb"
    edited.write_text(edited.read_text().replace("answer = None  # your answer here", "answer = 42", 1))
    mine, theirs = edited.read_bytes(), sha(edited)
    done = labkit_cli("exercises", "build", str(learner), "--force")
    assert done.returncode == 0, done.stderr
    copies = list(learner.glob("replaced-*/02_im2col.ipynb"))
    assert len(copies) == 1 and copies[0].read_bytes() == mine
    assert f"kept in {copies[0].parent}: 02_im2col.ipynb" in done.stdout
    assert sha(edited) != theirs  # the learner edition is back
    assert [p.name for p in copies[0].parent.iterdir()] == ["02_im2col.ipynb"]  # only what was replaced
    again = labkit_cli("exercises", "build", str(learner), "--force")  # its own output: nothing to keep
    assert again.returncode == 0 and "kept" not in again.stdout, again.stdout + again.stderr
