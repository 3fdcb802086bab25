"""The documentation tells the truth about what it shows (issue 38): every command in the
tutorial's and the README's shell blocks exists with the flags it is given, read by the parser
that will read it (the engine's argparse for `python -m training`, the client's for `trainyard`,
Django's for `manage.py`, the Makefile's targets for `make`); and every picture the docs and the
README show is in docs/images/ and is one a browser test takes (tests/docs_screenshots.py), so
`make screenshots` brings it up to date. The site itself is built by `make docs` (--strict) in
`make lint`."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, get_commands, load_command_class

from tests.docs_screenshots import DOCS_IMAGES
from tests.stack import ROOT

DOCS = ROOT / "docs"
# Where a reader copies commands from: the first screen and the tutorial.
COMMAND_PAGES = [ROOT / "README.md", DOCS / "tutorial.md"]
# Programs that are not Trainyard's to check: the system's, pip's, the shell's, the servers'.
OTHERS = {"pip", "curl", "celery", "daphne", "cd", "export", "git", "sudo", "tensorboard", "unzip"}
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<"}


def shell_commands(text: str) -> Iterator[list[str]]:
    """Each simple command of the text's shell blocks, as words: continuations joined, and the
    comments, redirections (with their files) and variables set before it dropped."""
    for block in SHELL_BLOCK.findall(text):
        # A line ends its command, but inside a quoted argument spanning lines (curl's -d).
        lexer = shlex.shlex(block.replace("\\\n", " ").replace("\n", "\n;"), posix=True,
                            punctuation_chars=";&|<>")  # fmt: skip
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        redirected = False
        for word in [*lexer, ";"]:
            if redirected:
                redirected = False  # the file a redirection names
            elif word in SEPARATORS:
                if words:
                    yield words
                words = []
            elif word in REDIRECTS:
                redirected = True
            elif words or not re.fullmatch(r"[A-Z_]+=\S*", word):  # PORT=9000 make run
                words.append(word)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets: set[str] = set()
    for names in re.findall(r"^([A-Za-z][\w .-]*?)\s*:(?![=])", text, flags=re.M):
        targets.update(names.split())
    return targets


def parse_failure(words: list[str]) -> str | None:
    """Why `words` would not run as written, by the parser that reads it; None when it parses."""
    program = Path(words[0]).name
    args = words[1:]
    if program == "python" or program.startswith("python3"):
        if args[:2] == ["-m", "training"]:
            return argparse_failure(lambda: engine_parse(args[2:]))
        if args[:1] == ["manage.py"]:
            program, args = "manage.py", args[1:]
        elif args[:2] == ["-m", "venv"] or args[:1] == ["-c"]:
            return None
        else:
            return f"no parser known for {' '.join(words[:3])}: add it to tests/test_docs.py"
    if program == "trainyard":
        from trainyard.cli import parser_build

        return argparse_failure(lambda: parser_build().parse_args(args))
    if program == "manage.py":
        return manage_failure(args)
    if program == "make":
        targets = [a for a in args if not re.fullmatch(r"[A-Z_]+=\S*", a)]
        unknown = sorted(set(targets) - make_targets())
        return f"no Makefile target {unknown}" if unknown else None
    if program in OTHERS:
        return None
    return f"{program}: not a command these docs may show (tests/test_docs.py's OTHERS)"


def engine_parse(args: list[str]) -> None:
    from training.config import parse_args

    parse_args(args)


def manage_failure(args: list[str]) -> str | None:
    name, rest = args[0], args[1:]
    app = get_commands().get(name)
    if app is None:
        return f"manage.py has no command {name!r}"
    parser = load_command_class(app, name).create_parser("manage.py", name)
    try:
        parser.parse_args(rest)
    except CommandError as exc:  # Django's parser, not called from a command line, raises
        return str(exc)
    return None


def argparse_failure(parse: Callable[[], object]) -> str | None:
    try:
        parse()
    except SystemExit as exc:  # argparse's error(): it printed why to stderr
        return f"refused by its parser (exit {exc.code})"
    return None


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: p.name)
def test_every_command_shown_parses(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = list(shell_commands(page.read_text()))
    assert commands, f"{page.name} shows no command"
    failures = {" ".join(words): parse_failure(words) for words in commands}
    bad = {command: why for command, why in failures.items() if why}
    assert not bad, f"{bad}\n{capsys.readouterr().err}"


def test_the_command_reader_catches_what_does_not_exist() -> None:
    text = (
        "```bash\nmake run   # fine\nmake serve\ntrainyard launch --nproc 2 --no-such-flag\n"
        "python -m training --strategy ddp --epochs x\n.venv/bin/python manage.py migrate --nope\n"
        "trainyard metrics 12 --format csv > run12.csv\nPORT=9000 make run && make docs\n```\n"
    )
    verdicts = [(words[:2], parse_failure(words)) for words in shell_commands(text)]
    fine = [why is None for _, why in verdicts]
    assert fine == [True, False, False, False, False, True, True, True], verdicts
    assert verdicts[-3] == (["trainyard", "metrics"], None)  # its redirection is no argument


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
TAKEN = re.compile(r"docs_screenshot\(\s*\w+,\s*(f?)\"([^\"]+)\"")


def pictures_shown() -> dict[str, Path]:
    """Each picture a page shows, by its path under docs/images/ (README's too)."""
    shown: dict[str, Path] = {}
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target in IMAGE.findall(page.read_text()):
            shown[target] = (page.parent / target).resolve()
    return shown


def names_taken() -> list[re.Pattern[str]]:
    """The names the browser tests save pictures under, an f-string's fields as wildcards."""
    patterns = []
    for test in (ROOT / "tests").glob("*.py"):
        for is_f, name in TAKEN.findall(test.read_text()):
            parts = re.split(r"\{[^}]*\}", name) if is_f else [name]
            patterns.append(re.compile("[\\w-]+".join(map(re.escape, parts))))
    return patterns


def test_every_picture_shown_exists_and_a_browser_test_takes_it() -> None:
    shown = pictures_shown()
    assert shown, "the docs show no picture"
    taken = names_taken()
    for target, path in shown.items():
        assert path.is_file(), f"{target}: no such file (make screenshots)"
        assert path.parent == DOCS_IMAGES and path.suffix == ".png", target
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{target} is no PNG"
        assert any(p.fullmatch(path.stem) for p in taken), f"{target}: no test takes it"


def test_every_picture_kept_is_shown() -> None:
    # A picture no page shows any more is dead weight in the repository.
    shown = set(pictures_shown().values())
    kept = set(DOCS_IMAGES.glob("*.png"))
    assert kept <= shown, sorted(p.name for p in kept - shown)
