"""What would Meridian do on my traffic: trace-driven replay through vLLM's own schedulers and
Meridian's policies, in virtual time on a hardware profile.

``traces`` and ``reasoning`` build the workload (real arrivals, production-derived reasoning
lengths, SLO classes), ``workload`` turns it into requests the offline engine replays,
``profiles`` holds the hardware/model step-time profiles, ``policies`` the schedulers compared
and how one is replayed, ``report`` the metrics, table and plots, and ``runner`` the whole run as
``meridian replay`` drives it.
"""
