"""The example outputs in docs/ come from real runs (issue 44): each ```-block that starts with ``$ planner ...``
is run again (in process, its own database) and the lines it shows must be in what the command prints now.

A block's ``...`` line stands for output left out, and a line ending ``; ...`` is cut there. Lines are compared
with their whitespace collapsed (the docs wrap long lines), numbers included: a spread's worst under-prediction
moves when store/residuals.json is computed again, and the doc's example must move with it. Cheap commands only
(a refused option, one ``predict``); probe and tune examples stay out (minutes of probes).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import REPO, CliResult


def _examples() -> list[tuple[str, str, list[str]]]:
    """(doc file, command line, the example's shown chunks) of each ``$ planner`` block in docs/."""
    found = []
    for doc in sorted((REPO / "docs").glob("*.md")):
        for block in re.findall(r"^```\w*\n(\$ planner .*?)^```", doc.read_text(), flags=re.M | re.S):
            command, *shown = block.splitlines()
            chunks, current = [], []
            for line in [*shown, "..."]:
                if line.strip() == "...":
                    if current:
                        chunks.append(" ".join(current))
                    current = []
                else:
                    current.append(line.strip())
            found.append((doc.name, command.removeprefix("$ planner "), chunks))
    return found


def _shown(chunk: str) -> str:
    """The chunk as the command prints it, whitespace collapsed; a line cut at ``; ...`` up to its ``;``."""
    return re.sub(r"; \.\.\.$", ";", " ".join(chunk.split()))


EXAMPLES = _examples()


def test_the_docs_have_examples_to_check() -> None:
    assert {doc for doc, _, _ in EXAMPLES} >= {"gpus.md", "plans.md"}
    assert all(chunks for _, _, chunks in EXAMPLES)


@pytest.mark.parametrize(("doc", "command", "chunks"), EXAMPLES, ids=[f"{d}:{c}" for d, c, _ in EXAMPLES])
def test_an_example_output_is_what_the_command_prints(
    cli: Callable[..., CliResult], db: Path, doc: str, command: str, chunks: list[str]
) -> None:
    result = cli(*shlex.split(command), "--db", db)
    printed = " ".join((result.out + "\n" + result.err).split())
    for chunk in chunks:
        assert _shown(chunk) in printed, f"{doc}: {chunk!r} is not in what `planner {command}` prints:\n{printed}"


def test_the_fp16_fallback_line_is_what_recommend_prints(cli: Callable[..., CliResult], db: Path) -> None:
    """docs/gpus.md quotes the line a V100 job without --dtype prints."""
    quoted = re.search(r"\(`(dtype: fp16 \(V100-32G[^`]*)`\)", (REPO / "docs" / "gpus.md").read_text())
    assert quoted
    result = cli("recommend", "--model", "opt-1.3b", "--gpu", "V100-32G", "--workload", "sft", "--db", db)
    assert result.rc == 0, result.err
    assert " ".join(quoted.group(1).split()) in " ".join(result.out.split())
