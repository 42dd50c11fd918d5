"""Dump CPython line tables and the line of every instruction offset, as the fixtures for
linetable.rs's tests.

Run from this directory, once per interpreter (the fixtures were made with pyenv's builds):

    for v in 3.8.18 3.9.18 3.10.13 3.11.7 3.12.1 3.13.0; do
        /root/.pyenv/versions/$v/bin/python3 dump_lines.py
    done

Each run writes lines-3.X.json here: for every code object compiled from SAMPLE below (the
module, its functions, nested functions, comprehensions, a generator, a lambda, a class body),
its name, co_firstlineno, the raw table bytes in hex (co_lnotab for 3.8/3.9, co_linetable for
3.10+), and "lines": the expected line of each 2-byte code unit, index i being byte offset 2*i
(null: no line). 3.8/3.9 derive it from dis.findlinestarts (the last line start at or before
the offset); 3.10+ from code.co_lines(), whose (start, end, line) ranges are in bytes.
"""
import dis
import json
import os
import sys
import types

BLANK_150 = "\n" * 150

SAMPLE = (
    '''\
import functools


def simple(a, b):
    c = a + b
    return c * 2


def loops(n):
    total = 0
    for i in range(n):

        if i % 2:
            total += i
        else:

            total -= 1
    while total > 0:
        total //= 3
    return total


def multiline(a, b, c):
    x = (a +
         b *
         c)
    y = max(
        a,
        b,
        c,
    )
    return {
        "x": x,
        "y": y,
    }


def trying(d, k):
    try:
        v = d[k]
    except KeyError:
        v = None
    except (TypeError, ValueError) as e:
        v = str(e)
    else:
        v = v + 1
    finally:
        d.clear()
    return v


def outer(x):
    def inner(y):
        return x + y

    def inner2(z):
        def innermost():
            return z * x
        return innermost
    return inner(inner2(x)())


def comp(xs):
    squares = [x * x for x in xs if x > 0]
    pairs = {x: y for x, y in zip(xs, squares)}
    total = sum(x + 1 for x in xs
                if x)
    return sorted(pairs, key=lambda k: -k), total


def gen(n):
    i = 0
    while i < n:
        yield i
        i += 1
    yield from range(3)


def big_jump(x):
    y = x + 1
'''
    + BLANK_150
    + '''\
    z = y * 2
    return z


def big_negative(seq):
    out = []
    for item in seq:
        out.append(item)
'''
    + BLANK_150
    + '''\
        out.append(item + 1)
    return out


def call_back(f, a):
    return f(a,
'''
    + BLANK_150
    + '''\
             a + 1)


def long_code(a):
'''
    + "".join("    a = a + %d * a - %d\n" % (i, i) for i in range(60))
    + '''\
    return a


def long_line(a):
    b = [''' + ", ".join("a + %d" % i for i in range(150)) + ''']
    return b


def deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


@deco

@functools.lru_cache(maxsize=None)
def decorated(n):
    return n + 1


class Thing:
    attr = 1

    def method(self):
        return self.attr


async def coro(x):
    await x
    async with x as y:
        pass
    return y
'''
)


def walk(code, out):
    out.append(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            walk(const, out)


def expected_lines(code):
    n_units = len(code.co_code) // 2
    lines = [None] * n_units
    if sys.version_info < (3, 10):
        starts = list(dis.findlinestarts(code))
        for i in range(n_units):
            offset = 2 * i
            line = None
            for start, lineno in starts:
                if start <= offset:
                    line = lineno
            lines[i] = line
    else:
        for start, end, lineno in code.co_lines():
            for offset in range(start, end, 2):
                if 0 <= offset // 2 < n_units:
                    lines[offset // 2] = lineno
    return lines


def main():
    module = compile(SAMPLE, "<sample>", "exec")
    codes = []
    walk(module, codes)
    if sys.version_info < (3, 10):
        table = lambda c: c.co_lnotab
    else:
        table = lambda c: c.co_linetable
    entries = []
    for code in codes:
        entries.append(
            {
                "name": code.co_name,
                "firstlineno": code.co_firstlineno,
                "table": table(code).hex(),
                "lines": expected_lines(code),
            }
        )
    minor = sys.version_info[1]
    doc = {"version": "%d.%d.%d" % sys.version_info[:3], "minor": minor, "code": entries}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lines-3.%d.json" % minor)
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(path, len(entries), "code objects", sum(len(e["lines"]) for e in entries), "offsets")


main()
