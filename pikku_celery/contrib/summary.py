"""A run as plain JSON-ready data, for pages of your own (from :mod:`pikku_celery.web.summary`)."""

from ..web.summary import attempt_dict, error_dict, event_dict, run_dict, run_summary, step_dict

__all__ = ["attempt_dict", "error_dict", "event_dict", "run_dict", "run_summary", "step_dict"]
