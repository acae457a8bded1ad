"""The environment API, under the one short name users write: `from prime_lab.envs import SingleTurnEnv, Rubric`.

The same objects as `prime_lab.lab.envs` (the folder that implements them stays where the layers put it); this is
the place the README, `prime env init` and the built-in environments name, as verifiers users write
`import verifiers as vf`.
"""

from prime_lab.lab.envs import *  # noqa: F403 - the public API, re-exported whole
from prime_lab.lab.envs import __all__ as __all__
