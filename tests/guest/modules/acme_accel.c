// SPDX-License-Identifier: GPL-2.0-only
/* A stand-in for a vendor VFIO provider (see vfio_dp_e1000e_vfio_pci.c): no alias. */
#define VENDOR_PROVIDER
#include "vfio_dp_e1000e_vfio_pci.c"
