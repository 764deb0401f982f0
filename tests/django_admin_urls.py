"""The URLs of the Django project `test_django_app` configures: the admin alone."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
