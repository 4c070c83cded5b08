"""Where a run's artifacts live: one small interface over an object store.

A worker writes checkpoints and exports to a local working folder (Orbax needs files);
with a store configured it then uploads them there (`rl_core.store.folders`), and a worker
on another host downloads them back, needing the store's address and credentials only,
not a shared filesystem. The control plane streams exports out of the same store.

`ArtifactStore` is the interface; `ObjectStore` implements it over obstore (the Rust
object_store crate: S3 and S3-compatible servers, a local folder, memory), so the embedded
default, a deployment's bucket and the unit tests' memory store run the same code.
Pure Python over obstore: no JAX, so the control plane imports it too.
"""

from rl_core.store.base import ArtifactStore, StoredObject, StoreError
from rl_core.store.folders import complete_folders, download_folder, upload_folder
from rl_core.store.objects import ObjectStore, check_store_url, open_store, store_setting

__all__ = [
    "ArtifactStore",
    "ObjectStore",
    "StoreError",
    "StoredObject",
    "check_store_url",
    "complete_folders",
    "download_folder",
    "open_store",
    "store_setting",
    "upload_folder",
]
