"""The exception tree drawn in exceptions.py's docstring is the one the classes make."""

from __future__ import annotations

import inspect
import re

import servescope.exceptions as exc_module
from servescope.exceptions import ConfigError, EndpointError, ServescopeError


def test_the_drawn_tree_is_the_class_tree():
    drawn: dict[str, str] = {}  # class -> parent, from the drawing's indentation
    stack: list[tuple[int, str]] = []
    for line in exc_module.__doc__.splitlines():
        m = re.match(r"^[\s│├└─]*([A-Z]\w+)\b", line)
        if not m or not m.group(1).endswith(("Error", "Payload")):
            continue
        depth, name = m.start(1), m.group(1)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            drawn[name] = stack[-1][1]
        stack.append((depth, name))
    classes = {
        name: cls.__bases__[0].__name__
        for name, cls in inspect.getmembers(exc_module, inspect.isclass)
        if issubclass(cls, ServescopeError) and cls is not ServescopeError
    }
    assert drawn == classes


def test_an_endpoint_failure_is_not_a_bad_setting():
    assert not issubclass(EndpointError, ConfigError) and not issubclass(EndpointError, ValueError)
    assert issubclass(EndpointError, ServescopeError)  # the CLI's one-line error catches both
