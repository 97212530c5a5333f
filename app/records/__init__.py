"""Records (SPEC §11): the interface the services use (``interface``), the filesystem backend
(``filesystem``), the tar stream of a Record (``tarstream``) and the object-store backend (``s3``,
imported only when configured: it needs boto3, the ``s3`` extra)."""

from app.records.filesystem import SUMS, FilesystemRecords, write_atomic
from app.records.interface import (
    LogState,
    RecordSealed,
    RecordStore,
    RecordStoreUnavailable,
    check_name,
    record_dir_name,
)

__all__ = [
    "SUMS",
    "FilesystemRecords",
    "LogState",
    "RecordSealed",
    "RecordStore",
    "RecordStoreUnavailable",
    "check_name",
    "record_dir_name",
    "write_atomic",
]
