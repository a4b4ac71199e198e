"""The hooks side: hookspecs, the plugin manager (composition root), platforms, the fence,
runners, the graph walk and the cross-rank check. torch is imported only where a device is
used.
"""
