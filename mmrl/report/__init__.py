"""HTML run report: summary, training curves and rollouts drawn on their media.

    from mmrl.report import build_report
    build_report(["runs/a", "runs/b"], out="report.html", steps=[10, 50])
"""
from mmrl.report.build import build_report

__all__ = ["build_report"]
