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

Tests the planner cannot split (a comparison inside a comprehension, statements other than asserts
and literal assignments) run whole in the sandbox, where a program can still game them; they are
counted (``info["unsplit"]``) and ``gyre check`` warns about them.
"""

from gyre.rewards.asserts.harness import helper_program, test_program
from gyre.rewards.asserts.judge import LeafError, decode_channel, helper_arguments, judge, leaf_values
from gyre.rewards.asserts.plan import AssertPlan, Unsplittable, plan_test

__all__ = ["AssertPlan", "LeafError", "Unsplittable", "decode_channel", "helper_arguments", "helper_program",
           "judge", "leaf_values", "plan_test", "test_program"]
