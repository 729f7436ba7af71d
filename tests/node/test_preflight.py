"""A node refuses an installation whose keyed Gaussian streams differ from the pinned one."""

from __future__ import annotations

import dataclasses

import pytest

from node.preflight import check_stream
from noise.stream import stream_fingerprint
from proto.federation import ConfigError
from tests.support.sample_config import make_config


def test_check_stream_accepts_this_installation_and_refuses_another() -> None:
    check_stream(make_config())  # no pinned fingerprint: nothing to compare
    check_stream(make_config(stream_check=stream_fingerprint()))
    other = dataclasses.replace(make_config(), stream_check="00" * 32)
    with pytest.raises(ConfigError, match=r"stream_check = '0000.*would not cancel") as error:
        check_stream(other)
    assert "numpy " in str(error.value) and "randomgen " in str(error.value)
