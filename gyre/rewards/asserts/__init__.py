"""Assert-style code tests, compared outside the sandbox.

Run inside the sandbox, ``assert solve(2) == 4`` can be gamed: ``solve`` may return an object whose
``__eq__`` always holds, rebind a builtin the assert uses, or read the expected value from the test's
own source and return it. So an assert is split where it is evaluated (``plan.py``):

- the **parent** (the reward process) evaluates the assert's structure: comparisons, boolean logic,
  arithmetic, subscripts, literals, the test's own literal constants and a fixed set of pure builtins
  (``len``, ``sorted``, ``abs``, ``math.isclose``...), over plain data (``judge.py``);
- the **sandbox** evaluates only the leaves the parent cannot: calls into the program or the setup,
  and names bound there. Each leaf's value is serialised (plain data only: numbers, strings, bytes,
  None and containers of them; an object of any other type fails the test) and sent back on a data
  channel (``harness.py``).

Expected values (the assert's literals outside the program's calls) never enter the sandbox, so a
program can only pass by producing the right data. Leaves that use only names the setup binds are
evaluated after the setup and before the program runs; their channel is closed before the program's
first line. A setup helper called with the program's values (``approx(solve(x), 0.5)``) runs in a
second sandbox run that holds the setup but not the program, with those values passed in as data.
The parent always evaluates the real builtins, whatever the program rebinds.

A loop over a literal list or tuple of cases (``for a, b in [(1, 2), (3, 4)]: assert f(a) == b``, or a
name bound to one) is unrolled into plain asserts first. Tests the planner still cannot split (a
comparison inside a comprehension, a loop over ``range``, other statements) run isolated
(``sandbox.boot.isolated``): the test runs in a sandboxed process the program never runs in, with the
program's functions as proxies that exchange plain data with the program's process, and writes the
verdict on a channel only it holds. An always-equal object, a rebound builtin, a printed token or an
early exit gains nothing there; what remains is that the program can read such a test's source. They
are counted (``info["unsplit"]``) and ``gyre check`` notes them.

Decoding is bounded (``judge.decode``): sizes of numbers, nodes and nesting, and sets or dict keys whose
elements share one hash, are refused, and so are the parent's operations whose cost the program's
values alone would decide (``judge._bounded``, ``judge._bounded_call``).
"""

from gyre.rewards.asserts.harness import helper_program, isolated_program, test_program
from gyre.rewards.asserts.judge import LeafError, decode_channel, helper_arguments, isolated_verdict, judge, leaf_values
from gyre.rewards.asserts.plan import AssertPlan, Unsplittable, plan_test

__all__ = ["AssertPlan", "LeafError", "Unsplittable", "decode_channel", "helper_arguments", "helper_program",
           "isolated_program", "isolated_verdict", "judge", "leaf_values", "plan_test", "test_program"]
