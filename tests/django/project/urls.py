from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/<str:item>", views.order),
    path("exempt/<str:item>", views.exempt),
    path("decorated/<int:pk>/", views.decorated),
    path("refunds/<int:pk>/", views.refund),
    path("async/<str:item>", views.async_order),
    path("stream", views.stream),
    path("crash", views.crash),
    path("ping", views.ping),
    path("secured/<str:item>", views.secured),
]
