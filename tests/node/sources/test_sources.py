"""sources/__init__.py: what every source shares."""

from __future__ import annotations

import errno

import pytest

from slurmhealth.node.sources import errno_name


@pytest.mark.parametrize(
    "code", [errno.ENOENT, errno.EINVAL, errno.EACCES, errno.ENODEV, errno.EIO, errno.ESTALE]
)
def test_errno_name_is_the_errno_modules_name(code):
    assert errno_name(OSError(code, "x")) == errno.errorcode[code]


def test_an_error_without_errno_is_named_by_its_class():
    assert errno_name(TimeoutError()) == "TimeoutError"
