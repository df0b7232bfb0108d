"""Airflow plugin: stratoflow's limit on password guessing at `POST /auth/token`.

FAB's auth manager limits only its UI's login form; `LoginRateLimit`
(stratoflow/services/login_limit.py) answers 429 to a login, or an address, with too many
recent failed sign-ins at the REST API's token endpoints. The services stack
(`stratoflow.services.config`) and docker-compose.yml point `AIRFLOW__CORE__PLUGINS_FOLDER` at
this folder; Airflow's api-server adds the middleware to its root app.
"""

from airflow.plugins_manager import AirflowPlugin

from stratoflow.services.login_limit import LoginRateLimit


class StratoflowLoginLimit(AirflowPlugin):
    name = "stratoflow_login_limit"
    fastapi_root_middlewares = [
        {"middleware": LoginRateLimit, "args": [], "kwargs": {}, "name": "sign-in limit"},
    ]
