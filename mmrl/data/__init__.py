"""Records -> Samples. Importing the package registers every record format (formats.py into
schema.FORMATS) and every synthetic generator (synthetic*.py and anchor_tasks.py into
synthetic.GENERATORS), so the
registries are full whichever submodule a caller imports first; the submodules import one way
(formats -> schema, synthetic_av / anchor_tasks -> synthetic -> schema, cache -> media)."""
from mmrl.data import anchor_tasks, formats, synthetic, synthetic_av  # noqa: F401  (registration)
