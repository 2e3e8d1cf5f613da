"""What a job reports: sacreBLEU from sufficient statistics (``evaluate``), a decoder's stats over time (``timeline``) and a finished job's tables and plots (``stats_tables``, ``stats_plots``).

Imports only the shared ``extras``; no other room, no ray."""
