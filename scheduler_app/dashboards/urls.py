"""Dashboard pages and the JSON endpoints their charts fetch (mounted at /dashboards/)."""

from django.urls import path

from scheduler_app.dashboards import views

app_name = "dashboards"

urlpatterns = [
    path("", views.index, name="index"),
    path("utilisation/", views.utilisation, name="utilisation"),
    path("jobs/", views.jobs, name="jobs"),
    path("qos/", views.qos, name="qos"),
    path("queue/", views.queue, name="queue"),
    path("whatif/", views.whatif, name="whatif"),
    path("whatif/<int:run_id>/", views.whatif_run, name="whatif_run"),
    path("api/utilisation.json", views.utilisation_json, name="api_utilisation"),
    path("api/jct.json", views.jct_json, name="api_jct"),
    path("api/qos.json", views.qos_json, name="api_qos"),
    path("api/queue.json", views.queue_json, name="api_queue"),
    path("api/admission.json", views.admission_json, name="api_admission"),
    path("api/prediction.json", views.prediction_json, name="api_prediction"),
    path("api/restarts.json", views.restarts_json, name="api_restarts"),
    path("api/whatif/<int:run_id>.json", views.whatif_run_json, name="api_whatif_run"),
]
