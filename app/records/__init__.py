"""Records (SPEC §11): the interface the services use (``interface``), the filesystem backend
(``filesystem``) and the tar stream of a Record (``tarstream``); an object-store backend can follow."""

from app.records.filesystem import SUMS, FilesystemRecords, write_atomic
from app.records.interface import LogState, RecordSealed, RecordStore, check_name, record_dir_name

__all__ = [
    "SUMS",
    "FilesystemRecords",
    "LogState",
    "RecordSealed",
    "RecordStore",
    "check_name",
    "record_dir_name",
    "write_atomic",
]
