"""Records -> Samples. Importing the package registers every record format (formats.py into
schema.FORMATS) and every synthetic generator (synthetic*.py -- synthetic_grid.py renders with mmrl/envs/grid_nav.py --, anchor_tasks.py and pretext.py into
synthetic.GENERATORS), so the registries are full whichever submodule a caller imports first; the
submodules import one way (formats -> record_parts -> schema, anchor_tasks / pretext ->
synthetic_av -> synthetic -> schema, cache -> media)."""
from mmrl.data import (anchor_tasks, formats, pretext, synthetic, synthetic_av,  # noqa: F401
                       synthetic_grid, synthetic_search)  # (registration)
