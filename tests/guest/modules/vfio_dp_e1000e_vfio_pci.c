// SPDX-License-Identifier: GPL-2.0-only
/*
 * A minimal VFIO variant driver for vfio_dp's real-kernel tests (issue 34), built by the
 * guest rig against the guest kernel's headers (tests/guest/rig.py build_modules): the
 * pattern of the upstream variant drivers on vfio_pci_core in Linux 6.1, without
 * migration -- vfio_alloc_device, vfio_pci_core_register_device, the core's ops and error
 * handlers, driver_managed_dma.
 *
 * Built as is, it matches the emulated e1000e (8086:10d3) with
 * PCI_DRIVER_OVERRIDE_DEVICE_VFIO, so kbuild writes
 *     alias vfio_pci:v00008086d000010D3sv*sd*bc*sc*i* vfio_dp_e1000e_vfio_pci
 * and the device is bound only through driver_override (never autoprobed).
 *
 * Built with -DVENDOR_PROVIDER (acme_accel.c), it stands in for a vendor VFIO provider:
 * the same registration with VFIO, but no id table (no alias at all) and a name that does
 * not look like a VFIO driver; bound by hand through driver_override.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/vfio.h>
#include <linux/vfio_pci_core.h>

static int vdp_open_device(struct vfio_device *core_vdev)
{
	struct vfio_pci_core_device *vdev =
		container_of(core_vdev, struct vfio_pci_core_device, vdev);
	int ret;

	ret = vfio_pci_core_enable(vdev);
	if (ret)
		return ret;
	vfio_pci_core_finish_enable(vdev);
	return 0;
}

static const struct vfio_device_ops vdp_ops = {
	.name		= KBUILD_MODNAME,
	.init		= vfio_pci_core_init_dev,
	.release	= vfio_pci_core_release_dev,
	.open_device	= vdp_open_device,
	.close_device	= vfio_pci_core_close_device,
	.ioctl		= vfio_pci_core_ioctl,
	.device_feature	= vfio_pci_core_ioctl_feature,
	.read		= vfio_pci_core_read,
	.write		= vfio_pci_core_write,
	.mmap		= vfio_pci_core_mmap,
	.request	= vfio_pci_core_request,
	.match		= vfio_pci_core_match,
};

static int vdp_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct vfio_pci_core_device *vdev;
	int ret;

	vdev = vfio_alloc_device(vfio_pci_core_device, vdev, &pdev->dev, &vdp_ops);
	if (IS_ERR(vdev))
		return PTR_ERR(vdev);

	dev_set_drvdata(&pdev->dev, vdev);
	ret = vfio_pci_core_register_device(vdev);
	if (ret) {
		vfio_put_device(&vdev->vdev);
		return ret;
	}
	dev_info(&pdev->dev, "%s: registered with VFIO\n", KBUILD_MODNAME);
	return 0;
}

static void vdp_remove(struct pci_dev *pdev)
{
	struct vfio_pci_core_device *vdev = dev_get_drvdata(&pdev->dev);

	vfio_pci_core_unregister_device(vdev);
	vfio_put_device(&vdev->vdev);
}

#ifndef VENDOR_PROVIDER
static const struct pci_device_id vdp_table[] = {
	{ PCI_DRIVER_OVERRIDE_DEVICE_VFIO(PCI_VENDOR_ID_INTEL, 0x10d3) },
	{}
};
MODULE_DEVICE_TABLE(pci, vdp_table);
#endif

static struct pci_driver vdp_driver = {
	.name			= KBUILD_MODNAME,
#ifndef VENDOR_PROVIDER
	.id_table		= vdp_table,
#endif
	.probe			= vdp_probe,
	.remove			= vdp_remove,
	.err_handler		= &vfio_pci_core_err_handlers,
	.driver_managed_dma	= true,
};

module_pci_driver(vdp_driver);

MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("vfio_dp test VFIO driver on vfio_pci_core (guest rig only)");
