"""The archive: git I/O and nodes (``store``), the LibCST edit format of mechanisms (``edit``), plumbing
(``gitio``) and the MLflow side of the record (``tracking``). Every operator reads and writes git only
through this package."""
