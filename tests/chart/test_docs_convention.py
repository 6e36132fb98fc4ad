"""The convention of the documents' shell blocks (tests/chart/docs_support.py), without a
cluster: what runs, what a marker skips, what breaks the convention; and both documents keep it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.docs_support import DocumentError, Substitution, blocks, run, scripts

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "docs" / "install.md", ROOT / "docs" / "operator.md")

SAMPLE = """# Title

```sh
echo one
```

## Section

```yaml
a: 1
```

<!-- not run by tests: needs a GPU cluster -->

```bash
nvidia-smi
```

```shell
echo KEY=...
```
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return path


def test_shell_blocks_in_order_with_their_markers(tmp_path: Path) -> None:
    found = blocks(write(tmp_path, SAMPLE))
    assert [(b.line, b.language, b.heading, b.not_run) for b in found] == [
        (3, "sh", "Title", None),
        (15, "bash", "Section", "needs a GPU cluster"),
        (19, "shell", "Section", None),
    ]
    assert found[0].text == "echo one\n"
    assert found[0].name == "doc.md:3 (under 'Title')"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("<!-- not run by tests: x -->\n```yaml\na: 1\n```\n", "marker before a 'yaml' block"),
        ("<!-- not run by tests: x -->\nsome text\n```sh\nls\n```\n", "not followed"),
        ("<!-- not run by tests: x -->\n", "not followed"),
        ("<!-- not run by tests:   -->\n```sh\nls\n```\n", "must give its reason"),
        ("```sh\nls\n", "never closed"),
    ],
    ids=["before-yaml", "before-text", "at-the-end", "no-reason", "unclosed-fence"],
)
def test_what_breaks_the_convention(tmp_path: Path, text: str, complaint: str) -> None:
    with pytest.raises(DocumentError, match=complaint):
        blocks(write(tmp_path, text))


def test_substitutions_are_applied_and_must_occur(tmp_path: Path) -> None:
    found = blocks(write(tmp_path, SAMPLE))
    change = Substitution("KEY=...", "KEY=secret", "the suite's credentials")
    planned = scripts(found, [change])
    assert [script for _, script in planned] == ["echo one\n", None, "echo KEY=secret\n"]
    with pytest.raises(DocumentError, match="no longer contain 'gone'"):
        scripts(found, [change, Substitution("gone", "x", "y")])


def test_a_block_runs_strictly_and_is_stopped_at_its_limit(tmp_path: Path) -> None:
    [block, *_] = blocks(write(tmp_path, SAMPLE))
    env = {"PATH": "/usr/bin:/bin"}
    failed = run(block, "false | true\necho after\n", cwd=tmp_path, env=env, timeout=30)
    assert failed.returncode == 1 and "after" not in failed.output  # pipefail, errexit
    unset = run(block, 'echo "$NOPE"\n', cwd=tmp_path, env=env, timeout=30)
    assert unset.returncode == 1 and "NOPE" in unset.output  # nounset
    slow = run(block, "echo started; sleep 60\n", cwd=tmp_path, env=env, timeout=1)
    assert slow.returncode is None and "started" in slow.output
    assert "was still running after" in slow.report([])


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_the_documents_keep_the_convention(path: Path) -> None:
    found = blocks(path)
    not_run = [b for b in found if b.not_run is not None]
    assert len(not_run) < len(found) - len(not_run), [b.name for b in not_run]
