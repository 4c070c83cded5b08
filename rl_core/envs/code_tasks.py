"""The task set of ``code_exec``: write one function, checked against test cases.

Each case is ``(args, expected)``; a case passes when the function returns a
value whose type has the expected one's name and whose ``repr`` is the expected
value's (so an object whose ``__eq__`` always says yes does not pass an ``int``
case). The comparison is the worker's, outside the sandbox: the sandbox sees the
arguments only (`checker_source`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CodeTask:
    name: str
    function: str  # the function's name
    signature: str
    description: str
    cases: tuple[tuple[tuple[Any, ...], Any], ...]

    @property
    def prompt(self) -> str:
        return f"Write a Python function `{self.signature}` that {self.description}"


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        "add",
        "add",
        "add(a, b)",
        "returns the sum of two integers.",
        (((1, 2), 3), ((-5, 5), 0), ((10**12, 1), 10**12 + 1)),
    ),
    CodeTask(
        "is_prime",
        "is_prime",
        "is_prime(n)",
        "returns True if the integer n is prime.",
        (
            ((2,), True),
            ((1,), False),
            ((0,), False),
            ((97,), True),
            ((91,), False),
            ((7919,), True),
        ),
    ),
    CodeTask(
        "reverse_words",
        "reverse_words",
        "reverse_words(s)",
        "returns the words of s in reverse order, joined by single spaces.",
        ((("hello world",), "world hello"), (("a  b c",), "c b a"), (("",), "")),
    ),
    CodeTask(
        "fizzbuzz",
        "fizzbuzz",
        "fizzbuzz(n)",
        "returns a list of strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples "
        "of 5, 'FizzBuzz' for both, else the number.",
        (
            ((5,), ["1", "2", "Fizz", "4", "Buzz"]),
            ((0,), []),
            (
                (15,),
                [
                    "1",
                    "2",
                    "Fizz",
                    "4",
                    "Buzz",
                    "Fizz",
                    "7",
                    "8",
                    "Fizz",
                    "Buzz",
                    "11",
                    "Fizz",
                    "13",
                    "14",
                    "FizzBuzz",
                ],
            ),
        ),
    ),
    CodeTask(
        "count_vowels",
        "count_vowels",
        "count_vowels(s)",
        "returns how many vowels (a, e, i, o, u, either case) s contains.",
        ((("hello",), 2), (("AEIOU xyz",), 5), (("",), 0), (("rhythm",), 0)),
    ),
    CodeTask(
        "fibonacci",
        "fibonacci",
        "fibonacci(n)",
        "returns the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1.",
        (((0,), 0), ((1,), 1), ((10,), 55), ((50,), 12586269025)),
    ),
    CodeTask(
        "is_palindrome",
        "is_palindrome",
        "is_palindrome(s)",
        "returns True if s reads the same backwards, ignoring case and non-alphanumerics.",
        ((("A man, a plan, a canal: Panama",), True), (("abc",), False), (("",), True)),
    ),
    CodeTask(
        "flatten",
        "flatten",
        "flatten(xs)",
        "returns a flat list of the values in the arbitrarily nested list xs, in order.",
        ((([1, [2, [3, [4]]], 5],), [1, 2, 3, 4, 5]), (([],), []), (([[[]]],), [])),
    ),
    CodeTask(
        "gcd",
        "gcd",
        "gcd(a, b)",
        "returns the greatest common divisor of two positive integers.",
        (((12, 18), 6), ((17, 5), 1), ((100, 10), 10)),
    ),
    CodeTask(
        "second_largest",
        "second_largest",
        "second_largest(xs)",
        "returns the second largest distinct value of the list xs, or None if there is none.",
        ((([3, 1, 2],), 2), (([5, 5, 4],), 4), (([7],), None), (([2, 2],), None)),
    ),
)
BY_NAME = {task.name: task for task in TASKS}


def checker_source(task: CodeTask, marker: str) -> str:
    """Python run after the model's code, in its namespace: calls the function on each
    case's arguments and prints ``marker`` + JSON of what came back, ``[type name, repr]``
    per case (null where it raised). The expected values are never in the sandbox: the
    worker compares (`results_match`), so a program that reads or forges this line can
    only report answers it computed."""
    arguments = [args for args, _ in task.cases]
    return (
        "def __rlaas_call(fn, arguments, marker):\n"
        "    import json\n"
        "    out = []\n"
        "    for args in arguments:\n"
        "        try:\n"
        "            got = fn(*args)\n"
        "            out.append([type(got).__name__, repr(got)])\n"
        "        except Exception:\n"
        "            out.append(None)\n"
        "    print(marker + json.dumps(out), flush=True)\n"
        f"__rlaas_call(globals().get({task.function!r}), {arguments!r}, {marker!r})\n"
    )


def passed_cases(task: CodeTask, reported: object) -> int:
    """How many cases the checker's report (see `checker_source`) got right: the value's
    type by name and its repr equal to the expected value's."""
    if not isinstance(reported, list) or len(reported) != len(task.cases):
        return 0
    passed = 0
    for got, (_, expected) in zip(reported, task.cases, strict=True):
        passed += got == [type(expected).__name__, repr(expected)]
    return passed
