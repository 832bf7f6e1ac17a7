"""Every subcommand of ``warpformer`` and every one of its options has a help string, and the
help of each renders (``warpformer <subcommand> -h``)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from warpformer.cli import SUBCOMMANDS, build_parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_has_help():
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: a.help for a in action._choices_actions}
    assert set(helps) == set(SUBCOMMANDS)
    assert all(h and h.strip() for h in helps.values()), helps


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_option_has_help(name):
    sub = _subparsers()[name]
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in sub._actions
               if "-h" not in a.option_strings
               and (not a.help or not str(a.help).strip() or a.help == argparse.SUPPRESS)]
    assert not missing, f"warpformer {name}: options without help: {', '.join(missing)}"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_help_renders(name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([name, "-h"])
    assert exit_info.value.code == 0
    assert f"usage: warpformer {name}" in out.getvalue()


def test_closed_output_pipe_ends_quietly(monkeypatch, capsys):
    # `warpformer generate ... | head` closes our stdout early: exit 1 without a traceback.
    from warpformer import cli

    def writes_to_a_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.SUBCOMMANDS, "demo", (cli.SUBCOMMANDS["demo"][0],
                                                  cli.SUBCOMMANDS["demo"][1],
                                                  writes_to_a_closed_pipe))
    assert cli.main(["demo"]) == 1
    assert "Traceback" not in capsys.readouterr().err
