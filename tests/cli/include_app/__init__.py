"""A project whose workflows Celery finds only through ``include=``: the app
module (:mod:`.celery`) never imports :mod:`.flows`, as in a real project
where only ``celery worker`` imports it."""
