"""The launch settings (launchers/settings.py): every launcher's flags as one frozen record, its defaults those of the
flags, and what start-up settles made into new records, never written into the one parsed."""

import dataclasses

import pytest

from local_chat.launchers.flags import parser
from local_chat.launchers.generate import build_parser
from local_chat.launchers.loading import check_before_the_server, start_batching
from local_chat.launchers.models_config import model_flags
from local_chat.launchers.settings import LaunchSettings


@pytest.mark.parametrize("flags", [parser("app"), build_parser()], ids=["browser", "generate"])
def test_each_launcher_parses_into_the_record_with_its_defaults(flags):
    parsed = flags.parse_args([])
    assert isinstance(parsed, LaunchSettings)
    defaults = LaunchSettings()
    own = {action.dest for action in flags._actions if action.dest != "help"}
    # a launcher without a flag gets the record's default, which is the other launcher's: the same either way
    assert {name: getattr(parsed, name) for name in own} == {name: getattr(defaults, name) for name in own}


def test_the_record_is_frozen_and_lists_are_tuples():
    settings = parser("app").parse_args(["--pretrained_path", "a", "b", "--gpu_ids", "0", "1"])
    assert settings.pretrained_path == ("a", "b") and settings.gpu_ids == (0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 8080


def test_a_flag_without_a_field_is_told_at_once():
    flags = parser("app")
    flags.add_argument("--new_flag", default=None)
    with pytest.raises(TypeError, match="new_flag"):
        flags.parse_args([])


def test_start_up_settles_values_in_new_records():
    given = parser("app").parse_args(["--host", "127.0.0.1"])
    settled = check_before_the_server(given)
    assert given.port is None and isinstance(settled.port, int)  # the port found free: in the new record only

    class Unbatched:
        batcher = None

        def start_batching(self, places, cache_bytes=None):
            return "one answer at a time"

    assert start_batching(Unbatched(), given).concurrency == 1 and given.concurrency is None
    assert start_batching(Unbatched(), given.but(concurrency=3)).concurrency == 3


def test_a_models_config_entry_makes_a_model_its_own_record():
    given = parser("app").parse_args(["--compile", "--quant", "8"])
    mine = model_flags(given, {"dtype": "bf16", "compile": False, "quant": 4}, "tiny")
    assert (mine.dtype, mine.compile, mine.quant) == ("bf16", False, 4)
    assert (given.dtype, given.compile, given.quant) == (None, True, 8)
