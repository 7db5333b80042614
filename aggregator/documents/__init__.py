"""Documents served as Markdown (`convert:`): which files convert (`formats`), one converter per format (`pdf`,
`word`, `slides`, `sheets`), the checks made before parsing (`zipped`), the bounded text they write (`markdown`),
and the worker processes they run in (`worker`, `pool`). Sources know nothing of it: the read path converts the
bytes a source returned (reads/file.py)."""
