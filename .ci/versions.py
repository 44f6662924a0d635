"""Print the versions the tests run with: the stack's key packages and the native libraries inside them.

CI runs it first (``make versions``), so that a break after a release of one of them shows at once.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

KEY = ("cubelake", "numpy", "rasterio", "rio-cogeo", "tifffile", "imagecodecs", "h5py", "zarr", "numcodecs",
       "xarray", "kerchunk", "obstore", "dask", "distributed", "torch", "pystac", "stac-fastapi-api", "fastapi",
       "cql2", "moto", "boto3", "s3fs", "pytest")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _native() -> list[tuple[str, str]]:
    import h5py
    import rasterio

    return [("GDAL (rasterio)", rasterio.__gdal_version__), ("PROJ (rasterio)", rasterio.__proj_version__),
            ("HDF5 (h5py)", h5py.version.hdf5_version)]


def main() -> None:
    rows = [("python", f"{platform.python_version()} ({sys.executable})"), ("platform", platform.platform())]
    rows += [(name, _version(name)) for name in KEY]
    rows += _native()
    width = max(len(name) for name, _ in rows)
    print("== versions")
    for name, version in rows:
        print(f"  {name:<{width}}  {version}")


if __name__ == "__main__":
    main()
