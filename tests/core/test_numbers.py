"""Every number from outside is bounded before it is parsed (fast: no server; the REST routes are in the server tests).

A memory import with a 5,000-digit number answered 500 (issue 22): `json.loads` raises a plain ValueError for
an integer of over 4,300 digits, and turns 1e400 into inf. At each edge where a number comes in (request bodies
and query arguments, memory imports, task files, cassettes, settings from the environment, CLI arguments) the
same hostile literals get the edge's own one-line refusal, never another exception; ordinary numbers, -0
among them, still read.
"""

from __future__ import annotations

import argparse
import json

import pytest

from workbench import strictnum
from workbench.brain.models.cassette import HEADER, read_entries, request_key
from workbench.config import from_env
from workbench.errors import CassetteError, ConfigError
from workbench.evals.tasks import load_tasks
from workbench.log.settings import LogSettings
from workbench.memory.transfer import parse_export
from workbench.server import bodies

HOSTILE = {
    "a 5,000-digit integer": "9" * 5000,
    "a negative 5,000-digit integer": "-" + "9" * 5000,
    "a 4,000-digit integer (within Python's own limit)": "1" * 4000,
    "an integer of 21 digits": "1" + "0" * 20,
    "1e400": "1e400",
    "-1e400": "-1e400",
    "a huge exponent": "1E99999999999999999999",
    "a 5,000-digit fraction": "0." + "1" * 5000,
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
}
CASES = sorted(HOSTILE.items())


def one_line(e: BaseException, most: int = 400) -> str:
    text = str(e)
    assert "\n" not in text and len(text) < most, text[:600]
    return text


@pytest.mark.parametrize("what, literal", CASES)
def test_the_json_hooks_refuse_what_does_not_fit_before_parsing_it(what, literal):
    with pytest.raises(strictnum.NumberRefused) as e:
        json.loads(f"[{literal}]", parse_int=strictnum.parse_int, parse_float=strictnum.parse_float,
                   parse_constant=strictnum.parse_constant)
    one_line(e.value)


def test_ordinary_numbers_still_read():
    hooks = {"parse_int": strictnum.parse_int, "parse_float": strictnum.parse_float, "parse_constant": strictnum.parse_constant}
    assert json.loads("[-0, 0, -0.0, 1e-400, 18446744073709551615, 1.5e300, 3]", **hooks) == \
        [0, 0, -0.0, 0.0, 2**64 - 1, 1.5e300, 3]
    assert strictnum.number(" 42 ", int) == 42 and strictnum.number("-0", int) == 0 and strictnum.number("+7", int) == 7
    assert strictnum.number("2.5", float) == 2.5 and strictnum.number("1e3", float) == 1000.0 and strictnum.number("7", float) == 7.0
    for text, kind in (("9" * 5000, int), ("1_000", int), ("١٢", int), ("0x10", int), ("1e3", int), ("2" + "0" * 19, int),
                       ("nan", float), ("inf", float), ("1e400", float), ("1_0.5", float), ("", int), ("٣.٥", float)):
        with pytest.raises(strictnum.NumberRefused) as e:
            strictnum.number(text, kind)
        one_line(e.value)
    with pytest.raises(argparse.ArgumentTypeError) as e:
        strictnum.argument(int)("9" * 5000)
    assert "5,000 characters" in one_line(e.value)


@pytest.mark.parametrize("what, literal", CASES)
def test_a_memory_import_refuses_a_hostile_number_as_a_bad_export(what, literal):
    doc = {"format": "workbench-memories", "format_version": 1, "store": "default", "memories": []}
    data = json.dumps(doc).replace('"format_version": 1', f'"format_version": {literal}').encode()
    with pytest.raises(ConfigError, match="not an export") as e:
        parse_export(data)
    one_line(e.value)


@pytest.mark.parametrize("what, literal", CASES)
def test_a_task_file_refuses_a_hostile_number_naming_its_line(tmp_path, what, literal):
    path = tmp_path / "tasks.jsonl"
    good = {"id": "a", "prompt": "p", "verifier": {"kind": "python", "code": "1"}}
    bad = json.dumps({**good, "id": "b", "limits": {"turns": 7}}).replace('"turns": 7', f'"turns": {literal}')
    path.write_text(json.dumps(good) + "\n" + bad + "\n")
    with pytest.raises(ConfigError, match="tasks.jsonl:2") as e:
        load_tasks(path)
    one_line(e.value)


@pytest.mark.parametrize("what, literal", CASES)
def test_a_cassette_refuses_a_hostile_number_naming_its_line(tmp_path, what, literal):
    entry = json.dumps({"key": request_key({"model": "m"}), "model": "m", "request": {"model": "m", "max_tokens": 1},
                        "error": None, "events": [{"type": "message_start", "message": {"role": "assistant", "content": []}}]})
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(dict(HEADER)) + "\n" + entry.replace('"max_tokens": 1', f'"max_tokens": {literal}') + "\n")
    with pytest.raises(CassetteError, match="line 2") as e:
        read_entries(path)
    one_line(e.value, most=600)


@pytest.mark.parametrize("what, literal", CASES)
def test_a_request_body_and_a_query_argument_refuse_a_hostile_number(what, literal):
    with pytest.raises(ConfigError) as e:
        bodies.parse(bodies.ForkBody, bodies.decode(f'{{"seq": {literal}}}'.encode()))
    one_line(e.value)
    with pytest.raises(ConfigError) as e:
        bodies.query_args(bodies.EventsArgs, {"after": [literal.encode()]})
    one_line(e.value)


@pytest.mark.parametrize("what, literal", [*CASES, ("1_000", "1_000"), ("other digits", "١٢"), ("nan", "nan"), ("inf", "inf")])
def test_a_setting_from_the_environment_refuses_a_hostile_number(monkeypatch, what, literal):
    # LogSettings has integer fields (max_depth) and float ones (query_timeout: 1e20 seconds is a float like any)
    for var in ("WORKBENCH_LOG_MAX_DEPTH", "WORKBENCH_LOG_QUERY_TIMEOUT")[:1 if literal == "1" + "0" * 20 else 2]:
        monkeypatch.setenv(var, literal)
        with pytest.raises(ConfigError, match=var) as e:
            from_env(LogSettings, prefix="WORKBENCH_LOG_")
        one_line(e.value)
        monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match="64 bits"):
        from_env(LogSettings, prefix="WORKBENCH_LOG_", max_depth=10**30)  # an override from a config file


def test_a_cli_argument_refuses_a_hostile_number_in_one_line(capsys):
    from workbench.cli.main import main

    for literal in ("9" * 5000, "١٢", "1_0"):
        with pytest.raises(SystemExit) as e:
            main(["sessions", "--limit", literal])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--limit" in err and len(err) < 300, err[:400]
