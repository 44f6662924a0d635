"""Test data for cubelake's tests, benchmarks and ``make samples``; needs the ``test`` extra.

- :mod:`cubelake.testing.emit`, :mod:`~cubelake.testing.prisma`, :mod:`~cubelake.testing.dlr` (EnMAP and
  DESIS deliveries) and :mod:`~cubelake.testing.netcdf`: small products written to each format's published
  layout, with known values, for testing the readers without accounts or gigabytes of downloads;
- :mod:`cubelake.testing.samples`: one of each (``python -m cubelake.testing.samples FOLDER``);
- :mod:`cubelake.testing.lakes`: synthetic lakes of many items, and a ``cubelake catalog serve`` process.

Nothing in the library imports this package.
"""
