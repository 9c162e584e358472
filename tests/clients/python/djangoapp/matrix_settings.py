"""Minimal Django settings for the client matrix: one app, no project scaffolding."""

import os

_db = {
    "ENGINE": "django.db.backends.postgresql",  # psycopg 3 is installed, so Django uses it
    "NAME": os.environ.get("PGDATABASE", "postgres"),
    "USER": os.environ.get("PGUSER", "postgres"),
    "PASSWORD": os.environ.get("PGPASSWORD", ""),
    "HOST": os.environ.get("PGHOST", "127.0.0.1"),
    "PORT": os.environ.get("PGPORT", "5432"),
    "OPTIONS": {"connect_timeout": 10},
}

DATABASES = {
    # Django's defaults: client-side parameter binding, no prepared statements.
    "default": _db,
    # Server-side binding with psycopg preparing every statement on first use.
    "prepared": {**_db, "OPTIONS": {**_db["OPTIONS"], "server_side_binding": True, "prepare_threshold": 0}},
    # A second session for LISTEN.
    "listener": dict(_db),
}

INSTALLED_APPS = ["django.contrib.postgres", "matrixapp"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
SECRET_KEY = "client-matrix-not-secret"
