"""The rules side: vocabulary, models, schema, loader, engine, compare and reports.

It imports without torch and never imports the runtime side (`warpolicy.runtime`).
"""
