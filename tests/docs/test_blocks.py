"""How tests/docs reads a Markdown file: fences, languages, console commands, markers."""

from __future__ import annotations

import subprocess

from tests.docs.blocks import REPO, Block, blocks, script

DOC = """\
# A doc

```console
$ echo one   # a comment
one
$ printf '%s\\n' a \\
    b
a
b
```

<!-- not-run: needs a GPU -->
```sh
nvidia-smi
```

```text
$ not a command
```
"""


def test_blocks_languages_commands_and_markers() -> None:
    doc = REPO / "build" / "tests-docs" / "doc.md"  # under the repository: where() is relative
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(DOC)
    console, gpu, text = blocks(doc)
    assert [(b.line, b.info, b.is_shell, b.not_run) for b in (console, gpu, text)] == [
        (3, "console", True, None), (13, "sh", True, "needs a GPU"), (17, "text", False, None)]
    assert console.commands() == "echo one   # a comment\nprintf '%s\\n' a \\\n    b\n"
    assert gpu.commands() == "nvidia-smi\n"
    done = subprocess.run(["bash", "-c", script([console])], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "one\na\nb\n")
    assert done.stderr == "### build/tests-docs/doc.md:3\n"
    # A failing command stops the script, and the block it was in is the last one announced.
    failing = Block(path=doc, line=40, info="sh", text="false\necho no\n", not_run=None)
    done = subprocess.run(["bash", "-c", script([console, failing])], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1 and "no" not in done.stdout
    assert done.stderr.splitlines()[-1] == "### build/tests-docs/doc.md:40"
